"""Mismatched reducescatter / alltoall calls fail on every rank within a
bound, naming the ranks and what each sent; the engine goes on. A rank
whose own alltoall splits are invalid gets InvalidArgumentError (Horovod's
error), the others FailedPreconditionError. Calls before init() are a
clear error."""

import time

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main
from kerasdist.tensorflow.library import raw_ops


def expect_error(fn, *needles, exc=tf.errors.FailedPreconditionError):
    start = time.time()
    try:
        fn()
    except tf.errors.OpError as e:
        assert type(e) is exc, (exc.__name__, type(e).__name__, str(e))
        msg = str(e)
        for needle in needles:
            assert needle in msg, (needle, msg)
        assert time.time() - start < 10, "error took too long"
        return msg
    raise AssertionError(f"expected a {exc.__name__}")


def bad_if(mine):
    """The error of a rank whose own splits are invalid, or of the others."""
    return tf.errors.InvalidArgumentError if mine else tf.errors.FailedPreconditionError


def check_reducescatter_mismatches(size, r):
    msg = expect_error(lambda: kd.reducescatter(tf.ones([4 + r, 2]), name="rs.shape"),
                       "Mismatched reducescatter", "'rs.shape'", "rank 0 sent",
                       "rank 1 sent", "[4, 2]", "[5, 2]")
    log("reducescatter shape mismatch:", msg.splitlines()[0][-200:])
    dtype = tf.float32 if r == 0 else tf.float64
    expect_error(lambda: kd.reducescatter(tf.ones([3], dtype), name="rs.dtype"),
                 "float32", "float64")
    expect_error(lambda: kd.reducescatter(tf.ones([3]), op=kd.Sum if r == 0 else kd.Average,
                                          name="rs.op"),
                 "reducescatter(sum)", "reducescatter(average)")
    expect_error(lambda: kd.reducescatter(tf.ones([3]), prescale_factor=1.0 + r,
                                          name="rs.scale"), "prescale")
    # A different collective under the same name.
    expect_error(lambda: (kd.reducescatter(tf.ones([3]), name="rs.kind") if r == 0
                          else kd.allreduce(tf.ones([3]), name="rs.kind")),
                 "Mismatched", "'rs.kind'")

    @tf.function
    def in_graph(x):
        return kd.reducescatter(x, name="rs.graph")

    expect_error(lambda: in_graph(tf.ones([2, 1 + r])), "Mismatched reducescatter", "'rs.graph'")


def check_alltoall_mismatches(size, r):
    last = size - 1
    expect_error(lambda: kd.alltoall(tf.ones([size, 2 + r]), name="a2a.trailing"),
                 "Mismatched alltoall", "'a2a.trailing'", "trailing")
    # One rank's bad splits fail the collective on every rank, naming it.
    bad = [-1] + [1] * (size - 2) + [2]
    mine = bad if r == last else [1] * size
    msg = expect_error(lambda: kd.alltoall(tf.ones([size]), splits=mine, name="a2a.negative"),
                       "Invalid splits for alltoall 'a2a.negative'",
                       f"rank {last} sent splits {bad}", exc=bad_if(r == last))
    log("alltoall bad splits:", msg.splitlines()[0][-240:])
    short = [size] if r == 0 else [1] * size
    expect_error(lambda: kd.alltoall(tf.ones([size]), splits=short, name="a2a.length"),
                 "rank 0 sent splits", f"Expected {size} non-negative", exc=bad_if(r == 0))
    over = [2] * size if r == 0 else [1] * size
    expect_error(lambda: kd.alltoall(tf.ones([size]), splits=over, name="a2a.sum"),
                 "rank 0 sent splits", f"first dimension of {size}", exc=bad_if(r == 0))
    expect_error(lambda: kd.alltoall(tf.ones([size + (1 if r == last else 0)]),
                                     name="a2a.indivisible"),
                 f"rank {last} sent no splits", "divisible", exc=bad_if(r == last))
    dtype = tf.int32 if r == 0 else tf.int64
    expect_error(lambda: kd.alltoall(tf.ones([size], dtype), name="a2a.dtype"),
                 "int32", "int64")


def check_alltoall_invalid_arguments(size, r):
    # Horovod's test_horovod_alltoall_splits_error / _equal_split_length_error:
    # every rank's own arguments are invalid, so every rank gets
    # InvalidArgumentError, eagerly, in a tf.function and in a session.
    bad = tf.errors.InvalidArgumentError
    expect_error(lambda: kd.alltoall(tf.ones([size + 1])),
                 f"rank {r} sent no splits for a first dimension of {size + 1}", exc=bad)
    expect_error(lambda: kd.alltoall(tf.ones([size]), splits=[2] * size),
                 f"rank {r} sent splits [{', '.join(['2'] * size)}]", exc=bad)
    expect_error(lambda: tf.function(kd.alltoall)(tf.ones([size - 1, 2])),
                 f"rank {r} sent no splits for a first dimension of {size - 1}", exc=bad)
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
        out, _ = kd.alltoall(tf.ones([size, 3]), splits=[1] * (size + 1))
        expect_error(lambda: sess.run(out), f"rank {r} sent splits", exc=bad)


def check_join_is_refused(size, r):
    last = size - 1
    if r == last:
        assert 0 <= kd.join() < last  # the others join after their errors
        return
    expect_error(lambda: kd.reducescatter(tf.ones([size]), name="rs.joined"),
                 "have joined", f"[{last}]")
    expect_error(lambda: kd.alltoall(tf.ones([size]), name="a2a.joined"), "have joined")
    kd.join()


def check_engine_recovers(size, r):
    y = kd.reducescatter(tf.fill([size * 2], float(r)), op=kd.Sum, name="rs.after")
    np.testing.assert_array_equal(y.numpy(), np.full([2], sum(range(size)), np.float32))
    out, got = kd.alltoall(tf.fill([size], r), splits=[1] * size, name="a2a.after")
    assert out.numpy().tolist() == list(range(size)) and got.numpy().tolist() == [1] * size


def check_before_init(size, r):
    @tf.function
    def traced(x):
        return kd.reducescatter(x, name="rs.traced")

    traced(tf.ones([size]))
    kd.shutdown()
    for fn in (lambda: kd.reducescatter(tf.ones([2])), lambda: kd.alltoall(tf.ones([2])),
               lambda: kd.grouped_reducescatter([tf.ones([2])]),
               lambda: kd.grouped_allgather([tf.ones([2])]),
               lambda: kd.broadcast_([tf.Variable([1.0])], 0)):
        try:
            fn()
            raise AssertionError("expected RuntimeError")
        except RuntimeError as e:
            assert "not initialized. Call `kerasdist.init()` first" in str(e), e
    # The kernels themselves, as a function traced earlier runs them.
    for fn in (lambda: traced(tf.ones([size])),
               lambda: raw_ops().kerasdist_alltoall(tf.ones([2]), tf.constant([], tf.int32))):
        try:
            fn()
            raise AssertionError("expected FailedPreconditionError")
        except tf.errors.FailedPreconditionError as e:
            assert "not initialized" in str(e), e
    kd.init()


def run():
    size, r = kd.size(), kd.rank()
    for c in (check_reducescatter_mismatches, check_alltoall_mismatches,
              check_alltoall_invalid_arguments, check_join_is_refused,
              check_engine_recovers, check_before_init):
        c(size, r)
        log(c.__name__, "passed")
    check_engine_recovers(size, r)


main(run)
