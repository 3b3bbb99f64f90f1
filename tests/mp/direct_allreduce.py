"""Small cached allreduces on the direct board (KERASDIST_DIRECT_ALLREDUCE_BYTES,
and KERASDIST_DIRECT_GROUP_BYTES for grouped allreduces).

A name moves to the board after it has completed through the coordinator,
so every check below runs a name first through the engine and then on the
board, and compares the two bit for bit and with numpy. It also checks that
the board was really used (the engine's counter of direct ops), and the
board's own decisions: a shape every rank changes, a tensor every rank grows
past the board (back through the engine), a mismatch (an error on every
rank, after which the name still works), a late peer, and join(). The same
for grouped allreduces, which move to the board as a whole.

Modes "slow", "frozen", "deadlock": rank 1 is busy for 5 s, stops (SIGSTOP),
or waits on a collective rank 0 never runs, while rank 0 waits for it on
the board. As for the engine's collectives: rank 0 waits for a slow peer,
and fails naming the frozen peer, or the deadlock, within their bounds.
"""

import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import kerasdist as kd
from _util import log, main
from kerasdist.common.basics import context

DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64,
          tf.int32, tf.int64, tf.uint8, tf.int8]
OPS = [kd.Sum, kd.Average, kd.Min, kd.Max, kd.Product]
# float32 elements that fit on the board.
FIT = int(os.environ.get("KERASDIST_DIRECT_ALLREDUCE_BYTES", 65536)) // 4
GROUP_FIT = int(os.environ.get("KERASDIST_DIRECT_GROUP_BYTES", 1 << 20)) // 4
GROUP_SHAPES = [(5,), (2, 3), (37,), (1, 1, 4)]


def direct_ops():
    return context.lib.kerasdist_direct_ops()


def rank_input(dtype, r, n=37):
    """Rank r's input: 1..5 (halved for floats), so that products stay small."""
    v = (np.arange(n) * (r + 3) + 7 * r) % 5 + 1
    v = v * 0.5 if dtype.is_floating else v
    return tf.cast(tf.constant(v), dtype)


def numpy_reduce(op, parts):
    a = np.stack(parts).astype(np.float64)
    if op == kd.Sum:
        return a.sum(0)
    if op == kd.Average:
        return a.mean(0)
    if op == kd.Min:
        return a.min(0)
    if op == kd.Max:
        return a.max(0)
    return a.prod(0)


def check_every_dtype_and_op(size, r):
    before = direct_ops()
    for dtype in DTYPES:
        for op in OPS:
            x = rank_input(dtype, r)
            name = f"d.{dtype.name}.{op}"
            # Rounds 1-2 through the coordinator (cached after 1, a board slot
            # announced with 2), rounds 3-4 on the board.
            outs = [kd.allreduce(x, op=op, name=name, prescale_factor=1.0, postscale_factor=1.0)
                    for _ in range(4)]
            ref = outs[0].numpy()
            for o in outs[1:]:
                np.testing.assert_array_equal(o.numpy().view(np.uint8), ref.view(np.uint8),
                                              err_msg=f"{name}: board differs from engine")
            parts = [tf.cast(rank_input(dtype, k), tf.float64).numpy()
                     for k in range(size)]
            want = numpy_reduce(op, parts)
            got = tf.cast(outs[-1], tf.float64).numpy()
            if dtype.is_integer and op == kd.Average:
                want = np.trunc(want)
            tol = 0.02 if dtype in (tf.float16, tf.bfloat16) else 1e-6
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)
    # Scales, on the board too.
    x = tf.fill([5], float(r + 1))
    for _ in range(4):
        y = kd.allreduce(x, op=kd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="d.scales")
        np.testing.assert_allclose(y.numpy(), np.full(5, 1.5 * size * (size + 1) / 2))
    used = direct_ops() - before
    assert used >= 2 * len(DTYPES) * len(OPS) + 2, f"only {used} ops ran on the board"


def check_chained(size, r):
    @tf.function
    def chain(x, k):
        body = lambda i, y: (i + 1, kd.allreduce(y + float(r), op=kd.Average, name="d.chain"))  # noqa: E731
        return tf.while_loop(lambda i, y: i < k, body, (tf.constant(0), x))[1]

    before = direct_ops()
    for n in (1, 1024, FIT):  # FIT: the largest on the board
        y = chain(tf.zeros([n]), tf.constant(300))
        np.testing.assert_array_equal(y.numpy(), np.full(n, 300 * (size - 1) / 2.0, np.float32))
    assert direct_ops() - before >= 3 * 290, direct_ops() - before


def check_shapes(size, r):
    before = direct_ops()
    for n in [3, 3, 3, 7, 1, FIT + 1, FIT + 999, 5, 2, 5]:  # FIT + ...: past the board
        y = kd.allreduce(tf.fill([n], float(r + 1)), op=kd.Sum, name="d.shapes")
        np.testing.assert_array_equal(y.numpy(), np.full(n, size * (size + 1) / 2, np.float32))
    # Board rounds: n = 3 (third), 7, 1, 5, 2, 5; the large ones went through the engine.
    assert direct_ops() - before == 6, direct_ops() - before


def expect_mismatch(call, *needles):
    """`call()` must fail with an OpError whose message holds every needle."""
    try:
        call()
    except tf.errors.OpError as e:
        for needle in needles:
            assert needle in str(e), str(e)
        return
    raise AssertionError(f"no error; expected one with {needles[0]!r}")


def check_mismatch(size, r):
    for _ in range(3):
        kd.allreduce(tf.ones([4]), name="d.mm")
    n = 4 if r == 0 else 5
    expect_mismatch(lambda: kd.allreduce(tf.ones([n]), name="d.mm"),
                    "Mismatched allreduce for tensor 'd.mm'",
                    "rank 0 sent allreduce(average) float32 [4]",
                    "rank 1 sent allreduce(average) float32 [5]")
    y = kd.allreduce(tf.fill([4], float(r)), name="d.mm")  # the next round is fine
    np.testing.assert_array_equal(y.numpy(), np.full(4, (size - 1) / 2, np.float32))


def check_late_peer(size, r):
    for delay in (0.0, 0.05, 0.3):
        for i in range(4):
            if r == size - 1:
                time.sleep(delay)
            y = kd.allreduce(tf.fill([16], float(r + i)), op=kd.Sum, name="d.late")
            np.testing.assert_array_equal(
                y.numpy(), np.full(16, size * i + size * (size - 1) / 2, np.float32))


def check_join(size, r):
    for _ in range(3):  # on the board from the third
        kd.allreduce(tf.ones([6]), op=kd.Average, name="d.join")
        kd.grouped_allreduce([tf.ones([2]), tf.ones([3])], op=kd.Average, name="d.join.group")
    # Ten times: one rank has three more batches, the others join; then every
    # rank again, at once (a rank still in join() when the others' next round
    # starts must not stand in for it).
    for rep in range(10):
        extra = rep % size
        if r == extra:
            for i in range(3):
                y = kd.allreduce(tf.fill([6], float(i + 10)), op=kd.Average, name="d.join")
                np.testing.assert_array_equal(y.numpy(), np.full(6, i + 10, np.float32))
                z = kd.allreduce(tf.fill([6], 2.0), op=kd.Sum, name="d.join.sum")
                np.testing.assert_array_equal(z.numpy(), np.full(6, 2.0, np.float32))
                g = kd.grouped_allreduce([tf.fill([2], float(i)), tf.fill([3], 4.0)],
                                         op=kd.Average, name="d.join.group")
                np.testing.assert_array_equal(g[0].numpy(), np.full(2, i, np.float32))
                np.testing.assert_array_equal(g[1].numpy(), np.full(3, 4.0, np.float32))
        kd.join()
        for i in range(2):
            y = kd.allreduce(tf.fill([6], float(r + i)), op=kd.Average, name="d.join")
            np.testing.assert_array_equal(y.numpy(), np.full(6, (size - 1) / 2 + i, np.float32))


def group_input(dtype, r, shapes=GROUP_SHAPES):
    counts = [int(np.prod(s)) for s in shapes]
    flat = rank_input(dtype, r, sum(counts))
    return [tf.reshape(t, s) for t, s in zip(tf.split(flat, counts), shapes)]


def check_groups(size, r):
    """Grouped allreduces: engine first, then the board, bit for bit."""
    before = direct_ops()
    for dtype in DTYPES:
        for op in OPS:
            xs = group_input(dtype, r)
            name = f"dg.{dtype.name}.{op}"
            outs = [kd.grouped_allreduce(xs, op=op, name=name) for _ in range(4)]
            for o in outs[1:]:
                for a, b, s in zip(o, outs[0], GROUP_SHAPES):
                    assert tuple(a.shape) == s, (name, a.shape, s)
                    np.testing.assert_array_equal(a.numpy().view(np.uint8), b.numpy().view(np.uint8),
                                                  err_msg=f"{name}: board differs from engine")
            flat = [tf.cast(tf.concat([tf.reshape(t, [-1]) for t in group_input(dtype, k)], 0),
                            tf.float64).numpy() for k in range(size)]
            want = numpy_reduce(op, flat)
            if dtype.is_integer and op == kd.Average:
                want = np.trunc(want)
            got = tf.cast(tf.concat([tf.reshape(t, [-1]) for t in outs[-1]], 0), tf.float64).numpy()
            tol = 0.02 if dtype in (tf.float16, tf.bfloat16) else 1e-6
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)
    used = direct_ops() - before
    assert used >= 2 * len(DTYPES) * len(OPS), f"only {used} grouped ops ran on the board"

    # Scales, and a group in a tf.function, chained.
    for _ in range(4):
        ys = kd.grouped_allreduce([tf.fill([3], float(r + 1)), tf.fill([2, 2], 1.0)], op=kd.Sum,
                                  prescale_factor=0.5, postscale_factor=3.0, name="dg.scales")
        np.testing.assert_allclose(ys[0].numpy(), np.full(3, 1.5 * size * (size + 1) / 2))
        np.testing.assert_allclose(ys[1].numpy(), np.full((2, 2), 1.5 * size))

    @tf.function
    def chain(a, b, k):
        def body(i, x, y):
            x2, y2 = kd.grouped_allreduce([x + float(r), y - float(r)], op=kd.Average,
                                          name="dg.chain")
            return i + 1, x2, y2
        return tf.while_loop(lambda i, x, y: i < k, body, (tf.constant(0), a, b))[1:]

    before = direct_ops()
    x, y = chain(tf.zeros([7]), tf.zeros([2, 50]), tf.constant(300))
    np.testing.assert_array_equal(x.numpy(), np.full(7, 300 * (size - 1) / 2.0, np.float32))
    np.testing.assert_array_equal(y.numpy(), np.full((2, 50), -300 * (size - 1) / 2.0, np.float32))
    assert direct_ops() - before >= 290, direct_ops() - before

    # Shapes: the same total split differently; more elements (a larger
    # place after one round through the engine); past the limit (engine).
    before = direct_ops()
    plans = [[4, 6], [4, 6], [4, 6], [6, 4], [10], [3, 3, 4], [40, 2], [40, 2],
             [GROUP_FIT, 8], [4, 6]]
    for sizes in plans:
        ys = kd.grouped_allreduce([tf.fill([n], float(r + 1)) for n in sizes], op=kd.Sum,
                                  name="dg.shapes")
        for n, t in zip(sizes, ys):
            np.testing.assert_array_equal(t.numpy(), np.full(n, size * (size + 1) / 2, np.float32))
    # On the board: the third [4, 6], [6, 4], [10] and [3, 3, 4] (the same
    # total under the group's name), the second [40, 2] (the first outgrew
    # the place and went through the engine), and the last [4, 6].
    assert direct_ops() - before == 6, direct_ops() - before

    # Mixed dtypes: through the engine, still exact.
    for _ in range(3):
        a, b = kd.grouped_allreduce([tf.fill([3], r + 1), tf.fill([2], float(r))], op=kd.Sum,
                                    name="dg.mixed")
        np.testing.assert_array_equal(a.numpy(), np.full(3, size * (size + 1) // 2, np.int32))
        np.testing.assert_array_equal(b.numpy(), np.full(2, size * (size - 1) / 2, np.float32))

    # A mismatch on the board fails on every rank; the next round is fine.
    for _ in range(3):
        kd.grouped_allreduce([tf.ones([4]), tf.ones([2])], name="dg.mm")
    expect_mismatch(
        lambda: kd.grouped_allreduce([tf.ones([4]), tf.ones([2 + (r == 0)])], name="dg.mm"),
        "Mismatched allreduce for tensor 'dg.mm'", "a group of 2 tensors")
    ys = kd.grouped_allreduce([tf.fill([4], float(r)), tf.fill([2], 1.0)], name="dg.mm")
    np.testing.assert_array_equal(ys[0].numpy(), np.full(4, (size - 1) / 2, np.float32))
    np.testing.assert_array_equal(ys[1].numpy(), np.full(2, 1.0, np.float32))

    # A group on the board whose dtypes differ on one rank only: a mismatch
    # on every rank at once (not a wait for a round that rank never posts);
    # then every rank sends the mixed group (through the engine, exact), and
    # the group of one dtype runs on the board again.
    for _ in range(3):
        kd.grouped_allreduce([tf.ones([4]), tf.ones([3])], name="dg.mixmm")
    t0 = time.time()
    expect_mismatch(
        lambda: kd.grouped_allreduce(
            [tf.ones([4]), tf.ones([3], tf.int32 if r == 1 else tf.float32)], name="dg.mixmm"),
        "Mismatched allreduce for tensor 'dg.mixmm'",
        "rank 1 sent a group of 2 tensors of several dtypes, 7 elements in all",
        "rank 0 sent a group of 2 tensors, allreduce(average) float32 [7]")
    assert time.time() - t0 < 30, time.time() - t0
    before = direct_ops()
    for _ in range(2):
        a, b = kd.grouped_allreduce([tf.fill([4], float(r)), tf.fill([3], r + 1)],
                                    op=kd.Sum, name="dg.mixmm")
        np.testing.assert_array_equal(a.numpy(), np.full(4, size * (size - 1) / 2, np.float32))
        np.testing.assert_array_equal(b.numpy(), np.full(3, size * (size + 1) // 2, np.int32))
    assert direct_ops() == before, direct_ops() - before
    ys = kd.grouped_allreduce([tf.fill([4], float(r)), tf.fill([3], 2.0)], op=kd.Sum,
                              name="dg.mixmm")
    np.testing.assert_array_equal(ys[0].numpy(), np.full(4, size * (size - 1) / 2, np.float32))
    np.testing.assert_array_equal(ys[1].numpy(), np.full(3, 2.0 * size, np.float32))
    assert direct_ops() == before + 1, direct_ops() - before


def run_checks():
    size, r = kd.size(), kd.rank()
    assert context.lib.kerasdist_direct_ops() == 0
    check_every_dtype_and_op(size, r)
    check_chained(size, r)
    check_shapes(size, r)
    check_mismatch(size, r)
    check_late_peer(size, r)
    check_join(size, r)
    check_groups(size, r)
    log("direct board checks passed")


def run_fault(mode):
    """A name on the board, then rank 1 misbehaves while rank 0 runs it."""
    r = kd.rank()
    comm = MPI.COMM_WORLD
    pids = comm.allgather(os.getpid())
    for _ in range(3):
        kd.allreduce(tf.ones([2]), name="d.f")
    comm.Barrier()
    t = time.time()
    if r == 1:
        if mode == "slow":  # busy elsewhere, alive: rank 0 must wait for it
            time.sleep(5)
        elif mode == "frozen":
            os.kill(os.getpid(), signal.SIGSTOP)
            os._exit(0)  # continued by rank 0: its engine is gone, so leave
        elif mode == "deadlock":  # waits on a collective rank 0 never runs
            try:
                kd.allreduce(tf.ones([3]), name="d.other")
            except tf.errors.OpError as e:
                log(f"deadlock peer error after {time.time() - t:.1f} s: {e.message}")
            comm.Barrier()
            os._exit(0)
    try:
        y = kd.allreduce(tf.fill([2], float(r)), name="d.f")
        np.testing.assert_array_equal(y.numpy(), np.full(2, 0.5, np.float32))
        log(f"{mode}: no error, waited {time.time() - t:.1f} s")
    except tf.errors.OpError as e:
        log(f"{mode} error after {time.time() - t:.1f} s: {e.message}")
    if mode == "frozen":
        os.kill(pids[1], signal.SIGCONT)
    if mode == "deadlock":
        comm.Barrier()
    if mode != "slow":
        sys.stdout.flush()
        os._exit(0)


if sys.argv[1:2] in (["slow"], ["frozen"], ["deadlock"]):
    main(lambda: run_fault(sys.argv[1]))
else:
    main(run_checks)
