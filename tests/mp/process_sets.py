"""Process sets: collectives among subsets of the ranks, each set with its own
engine. Run on 3 or 4 ranks.

Checks values against numpy for every collective on a set, that two
disjoint sets run at the same time without waiting for each other (the
even set finishes while the odd one is still waiting for a rank that sleeps),
the errors (not a member, root outside the set, disagreeing calls), removal,
a `fit` with `DistributedOptimizer(process_set=...)` whose replicas within
the set end bit-identical, and `init(process_sets=[...])` after a restart of
the engine.
"""

import time

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def expect(exc, fn, *needles):
    try:
        fn()
    except exc as e:
        for n in needles:
            assert n in str(e), (n, str(e))
        return
    raise AssertionError(f"expected {exc.__name__}")


def check_collectives(ps):
    r = kd.rank()
    ranks = ps.ranks
    me, n = ps.rank(), ps.size()
    assert me == ranks.index(r) and n == len(ranks)
    x = np.arange(7, dtype=np.float32) + 10 * r
    got = kd.allreduce(tf.constant(x), op=kd.Sum, process_set=ps).numpy()
    want = sum(np.arange(7, dtype=np.float32) + 10 * q for q in ranks)
    np.testing.assert_array_equal(got, want)
    got = kd.allreduce(tf.constant(x), process_set=ps).numpy()  # Average over the set
    np.testing.assert_allclose(got, want / n, rtol=1e-6)
    outs = kd.grouped_allreduce([tf.constant(x), tf.constant([float(r)])], op=kd.Max,
                                process_set=ps)
    np.testing.assert_array_equal(outs[1].numpy(), [float(max(ranks))])
    got = kd.allgather(tf.fill([r + 1, 2], r), process_set=ps).numpy()
    want = np.concatenate([np.full([q + 1, 2], q, np.int32) for q in ranks])
    np.testing.assert_array_equal(got, want)
    a, b = kd.grouped_allgather([tf.constant([r]), tf.constant([[1.0 * r]])], process_set=ps)
    np.testing.assert_array_equal(a.numpy(), ranks)
    for root in ranks:  # root_rank is a rank of the whole job, as in Horovod
        got = kd.broadcast(tf.constant([r, r]), root_rank=root, process_set=ps).numpy()
        np.testing.assert_array_equal(got, [root, root])
    v = tf.Variable([float(r)] * 3)
    kd.broadcast_([v], root_rank=ranks[-1], process_set=ps)
    np.testing.assert_array_equal(v.numpy(), [float(ranks[-1])] * 3)
    rows = kd.reducescatter(tf.ones([2 * n + 1, 2]) * (r + 1), op=kd.Sum, process_set=ps)
    d = 2 * n + 1
    assert rows.shape[0] == d // n + (1 if me < d % n else 0), rows.shape
    np.testing.assert_array_equal(rows.numpy(), np.full(rows.shape, sum(q + 1 for q in ranks)))
    # alltoall: member i sends i + j + 1 rows to member j.
    splits = [me + j + 1 for j in range(n)]
    t = tf.fill([sum(splits)], r)
    out, received = kd.alltoall(t, splits=splits, process_set=ps)
    np.testing.assert_array_equal(received.numpy(), [i + me + 1 for i in range(n)])
    np.testing.assert_array_equal(
        out.numpy(), np.concatenate([np.full(i + me + 1, q) for i, q in enumerate(ranks)]))
    objs = kd.allgather_object({"rank": r}, process_set=ps)
    assert objs == [{"rank": q} for q in ranks], objs
    assert kd.broadcast_object(r * 100, root_rank=ranks[0], process_set=ps) == ranks[0] * 100
    kd.barrier(ps)  # Horovod's positional process_set
    w2 = tf.Variable([float(r), 1.0])
    kd.broadcast_variables([w2], ranks[0], ps, inplace=True)  # Horovod's argument order
    np.testing.assert_array_equal(w2.numpy(), [float(ranks[0]), 1.0])

    @tf.function
    def graph_step(t):
        return (kd.allreduce(t, op=kd.Sum, process_set=ps), kd.size_op(process_set=ps),
                kd.process_set_included_op(process_set=ps))

    s, size, inc = graph_step(tf.constant([1.0]))
    assert float(s[0]) == n and int(size) == n and int(inc) == 1
    # A gradient through a process-set allreduce reduces over the same set.
    w = tf.Variable([1.0 + r])
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(kd.allreduce(w * w, op=kd.Sum, process_set=ps))
    g = tape.gradient(y, w).numpy()
    np.testing.assert_allclose(g, [2.0 * (1.0 + r) * n])


def check_concurrent(even, odd):
    """The odd set's first member sleeps before its allreduce; the even set
    must finish meanwhile, on its own engine."""
    r = kd.rank()
    start = time.time()
    if even.included():
        got = kd.allreduce(tf.constant([1.0]), op=kd.Sum, process_set=even, name="conc")
        took = time.time() - start
        assert float(got[0]) == even.size()
        everyone = kd.allgather_object(("even", took))
    else:
        if r == odd.ranks[0]:
            time.sleep(3.0)
        got = kd.allreduce(tf.constant([1.0]), op=kd.Sum, process_set=odd, name="conc")
        assert float(got[0]) == odd.size()
        everyone = kd.allgather_object(("odd", time.time() - start))
    even_times = [t for kind, t in everyone if kind == "even"]
    odd_times = [t for kind, t in everyone if kind == "odd"]
    # Not a timing assertion on speed: the even set must not have waited for
    # the sleeping odd rank (3 s), which a shared engine would have forced.
    assert max(even_times) < 2.5 <= min(odd_times), everyone
    log(f"disjoint sets ran at once: even {max(even_times):.2f} s, odd {min(odd_times):.2f} s")


def size_of_job():
    return kd.size()


def check_errors(even, odd):
    r = kd.rank()
    other = odd if even.included() else even
    expect(ValueError, lambda: kd.allreduce(tf.ones([2]), process_set=other),
           "not in it", f"({r})")
    mine = even if even.included() else odd
    outsider = other.ranks[0]
    expect(ValueError, lambda: kd.broadcast(tf.ones([2]), root_rank=outsider, process_set=mine),
           "root_rank")
    assert int(kd.process_set_included_op(process_set=other)) == 0
    assert int(kd.size_op(process_set_id=other.process_set_id)) == other.size()
    # Ranks that disagree on add_process_set: an error on every rank, no hang.
    expect(ValueError, lambda: kd.add_process_set([0, 1] if r == 0 else [0, 2]),
           "same ranks")
    expect(ValueError, lambda: kd.add_process_set(even.ranks), "exists already")
    # A bad set on one rank only: the same error on every rank.
    expect(ValueError, lambda: kd.add_process_set([0, size_of_job()] if r == 0 else [0, 1]),
           "rank 0: Invalid ranks")
    expect(ValueError, lambda: kd.remove_process_set(kd.global_process_set), "global")
    expect(ValueError, lambda: kd.ProcessSet([0, 0]), "distinct")
    # A mismatch inside a set fails that collective on the set's ranks only.
    if mine.size() > 1:
        expect(tf.errors.FailedPreconditionError,
               lambda: kd.allreduce(tf.ones([2 + mine.rank()]), process_set=mine, name="mm"),
               "Mismatched")
    got = kd.allreduce(tf.ones([2]), op=kd.Sum, process_set=mine, name="after.mm")
    np.testing.assert_array_equal(got.numpy(), [mine.size()] * 2)
    log("errors passed")


def check_fit(ps):
    import keras

    r = kd.rank()
    keras.utils.set_random_seed(r)  # different initial weights everywhere
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.05), process_set=ps),
                  loss="mse")
    x = np.random.default_rng(10 + r).standard_normal((32, 4)).astype(np.float32)
    model.fit(x, x.sum(axis=1), batch_size=8, epochs=1, verbose=0)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    everyone = kd.allgather_object(weights.tobytes(), process_set=ps)
    assert all(b == everyone[0] for b in everyone), "replicas in the set differ"
    log(f"fit on {ps.ranks}: replicas bit-identical")


def run():
    size, r = kd.size(), kd.rank()
    assert kd.global_process_set.ranks == list(range(size))
    assert kd.global_process_set.size() == size and kd.global_process_set.rank() == r
    pending = kd.ProcessSet([0, 1])  # Horovod's answers before registration
    assert pending.size() is None and pending.rank() is None
    assert pending.included() == (r in (0, 1))
    even = kd.add_process_set([q for q in range(size) if q % 2 == 0])
    odd = kd.add_process_set(kd.ProcessSet([q for q in range(size) if q % 2 == 1]))
    assert even.process_set_id == 1 and odd.process_set_id == 2, (even, odd)
    mine = even if r % 2 == 0 else odd
    check_collectives(mine)
    log("collectives on", mine.ranks, "passed")
    check_concurrent(even, odd)
    check_errors(even, odd)
    check_fit(mine)
    # The global set still works alongside.
    got = kd.allreduce(tf.constant([1.0]), op=kd.Sum, name="global.after")
    assert float(got[0]) == size
    assert kd.remove_process_set(odd) is True and odd.process_set_id is None
    expect(ValueError, lambda: kd.allreduce(tf.ones([1]), process_set=odd), "not registered")
    assert kd.remove_process_set(odd) is False
    assert kd.remove_process_set(even) is True
    # A communicator split, as from MPI.COMM_WORLD.Split: each rank passes its own.
    from mpi4py import MPI

    sub = MPI.COMM_WORLD.Split(color=r % 2, key=r)
    split = kd.add_process_set(kd.ProcessSet(sub))
    assert split.ranks == [q for q in range(size) if q % 2 == r % 2], split
    got = kd.allreduce(tf.constant([float(r)]), op=kd.Sum, process_set=split)
    assert float(got[0]) == sum(split.ranks)
    # Each rank removes its own set of the split: all of them go.
    assert kd.remove_process_set(split) is True and split.process_set_id is None
    assert kd.add_process_set([0]).ranks == [0]  # ids and registry still agree
    # Static sets given to init(), after a restart of the engine.
    kd.shutdown()
    assert even.process_set_id is None
    first_two = kd.ProcessSet([0, 1])
    kd.init(process_sets=[first_two])
    assert first_two.process_set_id == 1
    if first_two.included():
        got = kd.allreduce(tf.constant([1.0]), op=kd.Sum, process_set=first_two)
        assert float(got[0]) == 2
    kd.barrier()
    log("process set checks passed")


main(run)
