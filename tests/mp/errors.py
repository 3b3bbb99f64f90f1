"""Mismatches fail on every rank within seconds; the engine keeps working."""

import time

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def expect_error(fn, *needles):
    start = time.time()
    try:
        fn()
    except tf.errors.FailedPreconditionError as e:
        msg = str(e)
        for needle in needles:
            assert needle in msg, (needle, msg)
        assert time.time() - start < 10, "error took too long"
        return msg
    raise AssertionError("expected a FailedPreconditionError")


def run():
    size, r = kd.size(), kd.rank()
    msg = expect_error(lambda: kd.allreduce(tf.ones([4 + r]), name="shape"),
                       "Mismatched allreduce", "'shape'", "rank 0 sent", "[4]", "[5]")
    log("shape mismatch:", msg.splitlines()[0][:200])
    dtype = tf.float32 if r == 0 else tf.float64
    expect_error(lambda: kd.allreduce(tf.ones([3], dtype), name="dtype"), "float32", "float64")
    expect_error(lambda: kd.allreduce(tf.ones([3]), op=kd.Sum if r == 0 else kd.Max, name="op"),
                 "allreduce(sum)", "allreduce(max)")
    expect_error(lambda: kd.broadcast(tf.ones([2]), root_rank=r % size, name="root") if size > 1
                 else (_ for _ in ()).throw(tf.errors.FailedPreconditionError(None, None, "root")),
                 "root")
    expect_error(lambda: kd.allgather(tf.ones([2, 2 + r]), name="gather"), "allgather")
    kd.barrier()
    # The engine still works after all of that.
    out = kd.allreduce(tf.fill([5], float(r)), op=kd.Sum, name="after")
    np.testing.assert_array_equal(out.numpy(), np.full(5, sum(range(size)), np.float32))


main(run)
