"""Collectives finished on the kernel's own thread (KERASDIST_SPIN_MICROSECONDS).

Run with the spin off, short and very long: each result is checked against
numpy whichever thread finished it, including when the wait runs out (a late
peer), when another op arrives during the wait (a grouped step), and when
the collective fails (a mismatch must still fail on every rank).
"""

import os
import time

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def run():
    size, r = kd.size(), kd.rank()
    spin = int(os.environ["KERASDIST_SPIN_MICROSECONDS"])
    half = (size - 1) / 2.0

    # Chained in a tf.function: each op waits for the previous one, so the
    # engine is idle at every enqueue and the kernel waits for its result.
    @tf.function
    def chain(x, k):
        body = lambda i, y: (i + 1, kd.allreduce(y + float(r), op=kd.Average, name="iw.chain"))  # noqa: E731
        return tf.while_loop(lambda i, y: i < k, body, (tf.constant(0), x))[1]

    for n in (1, 1024, 300000):  # small-buffer path and ring
        y = chain(tf.zeros([n]), tf.constant(200))
        np.testing.assert_array_equal(y.numpy(), np.full(n, 200 * half, np.float32))

    @tf.function
    def bcast(x, k):
        body = lambda i, y: (i + 1, kd.broadcast(y + float(r + 1), root_rank=size - 1, name="iw.bc"))  # noqa: E731
        return tf.while_loop(lambda i, y: i < k, body, (tf.constant(0), x))[1]

    np.testing.assert_array_equal(bcast(tf.zeros([7]), tf.constant(50)).numpy(),
                                  np.full(7, 50.0 * size, np.float32))

    # Chained allgather with a different number of rows on every rank (the
    # engine allocates the output, the kernel may finish the op), and a
    # barrier after every step.
    rows = [rr + 1 for rr in range(size)]
    offsets = np.cumsum([0] + rows)

    @tf.function
    def gather(x, k):
        def body(i, y):
            g = kd.allgather(y + float(r), name="iw.ag")
            kd.barrier(name="iw.barrier")  # stateful: kept by automatic control dependencies
            return i + 1, tf.ensure_shape(g[offsets[r]:offsets[r + 1]], y.shape)
        return tf.while_loop(lambda i, y: i < k, body, (tf.constant(0), x))[1]

    for cols in (1, 1024):
        y = gather(tf.zeros([rows[r], cols]), tf.constant(100))
        np.testing.assert_array_equal(y.numpy(), np.full([rows[r], cols], 100.0 * r, np.float32))
    for delay in (0.0, 0.05):  # the wait runs out on the ranks that are early
        if r == 0:
            time.sleep(delay)
        g = kd.allgather(tf.fill([rows[r], 2], float(r)), name="iw.ag.late")
        want = np.concatenate([np.full([rows[rr], 2], float(rr), np.float32) for rr in range(size)])
        np.testing.assert_array_equal(g.numpy(), want)

    # Chained reducescatter, alltoall and grouped allgather.
    @tf.function
    def scatter_chain(x, k):
        def body(i, y):
            full = tf.tile(y, [size, 1])                           # [size * 3, 4]
            part = kd.reducescatter(full + float(r), op=kd.Sum, name="iw.rs")  # [3, 4]
            moved = kd.alltoall(full, name="iw.a2a")                 # rank p's rows [r]
            ga, = kd.grouped_allgather([part[:1]], name="iw.gag")    # [size, 4]
            out = part - float(size * (size - 1) / 2) + 0.0 * tf.reduce_sum(moved) \
                + 0.0 * tf.reduce_sum(ga)
            return i + 1, tf.ensure_shape(out, [3, 4])
        return tf.while_loop(lambda i, y: i < k, body, (tf.constant(0), x))[1]

    y0 = tf.reshape(tf.range(12, dtype=tf.float32), [3, 4])
    y = scatter_chain(y0, tf.constant(10))  # exact in float32: 11 * 3 ** 10 < 2 ** 24
    np.testing.assert_array_equal(y.numpy(), y0.numpy() * size ** 10)

    @tf.function
    def scatter_once(x):
        return (kd.alltoall(x, name="iw.a2a.check"),
                kd.grouped_allgather([x[:1], x[:2]], name="iw.gag.check"),
                kd.reducescatter(x, op=kd.Sum, name="iw.rs.check"))

    for _ in range(30):
        moved, (g1, g2), rs = scatter_once(tf.fill([size, 2], float(r)))
        ranks = np.arange(size, dtype=np.float32)
        np.testing.assert_array_equal(moved.numpy(), np.repeat(ranks, 2).reshape(size, 2))
        np.testing.assert_array_equal(g1.numpy(), np.repeat(ranks, 2).reshape(size, 2))
        np.testing.assert_array_equal(g2.numpy(), np.repeat(ranks, 4).reshape(2 * size, 2))
        np.testing.assert_array_equal(rs.numpy(), np.full([1, 2], ranks.sum(), np.float32))

    # Grouped in a tf.function and eagerly: many requests from one kernel.
    @tf.function
    def grouped(ts):
        return kd.grouped_allreduce(ts, op=kd.Sum, name="iw.group")

    for _ in range(20):
        ts = [tf.fill([k + 1], float(r + k)) for k in range(30)]
        for k, out in enumerate(grouped(ts)):
            want = sum(rr + k for rr in range(size))
            np.testing.assert_array_equal(out.numpy(), np.full(k + 1, want, np.float32))
        outs = kd.grouped_allreduce(ts, op=kd.Max, name="iw.group.eager")
        for k, out in enumerate(outs):
            np.testing.assert_array_equal(out.numpy(), np.full(k + 1, size - 1 + k, np.float32))

    # A late peer: the waiting ranks' wait runs out (unless it is longer
    # than the delay) and the engine finishes their ops.
    for delay in (0.0, 0.05, 0.3):
        if r == size - 1:
            time.sleep(delay)
        out = kd.allreduce(tf.fill([3], float(r)), op=kd.Sum, name="iw.late")
        np.testing.assert_array_equal(out.numpy(), np.full(3, size * (size - 1) / 2, np.float32))

    # Concurrent independent ops in one function: the second arrives while
    # the first may be waiting on its thread.
    @tf.function
    def pair(a, b):
        return (kd.allreduce(a, op=kd.Sum, name="iw.pa"), kd.allreduce(b, op=kd.Min, name="iw.pb"))

    for _ in range(50):
        a, b = pair(tf.fill([5], float(r)), tf.fill([6], float(r + 3)))
        np.testing.assert_array_equal(a.numpy(), np.full(5, size * (size - 1) / 2, np.float32))
        np.testing.assert_array_equal(b.numpy(), np.full(6, 3.0, np.float32))

    # A failing collective still fails on every rank, in time.
    start = time.time()
    try:
        kd.allreduce(tf.ones([4 + r]), name="iw.mismatch")
        raise AssertionError("expected a FailedPreconditionError")
    except tf.errors.FailedPreconditionError as e:
        assert "Mismatched allreduce" in str(e), str(e)
    assert time.time() - start < 10
    try:
        kd.allgather(tf.ones([2, 3 + r]), name="iw.ag.mismatch")
        raise AssertionError("expected a FailedPreconditionError")
    except tf.errors.FailedPreconditionError as e:
        assert "allgather" in str(e), str(e)
    assert time.time() - start < 20
    out = kd.allreduce(tf.fill([2], 1.0), op=kd.Sum, name="iw.after")
    np.testing.assert_array_equal(out.numpy(), np.full(2, float(size), np.float32))
    log(f"inline wait checks passed (spin {spin} us)")


main(run)
