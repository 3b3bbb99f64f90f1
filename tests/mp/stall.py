"""Stall inspector: a warning names the missing rank; with a shutdown time
set, the stalled collective fails on every rank instead of hanging.

Run with KERASDIST_STALL_CHECK_TIME_SECONDS=1 and, for argv[1] == "shutdown",
KERASDIST_STALL_SHUTDOWN_TIME_SECONDS=3.
"""

import sys
import time

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def run():
    size, r = kd.size(), kd.rank()
    if sys.argv[1] == "warn":
        if r == size - 1:
            time.sleep(3)  # late, but not absent
        out = kd.allreduce(tf.ones([4]), op=kd.Sum, name="late_tensor")
        np.testing.assert_array_equal(out.numpy(), np.full(4, size, np.float32))
        return
    # shutdown: the last rank never submits 'never_tensor'.
    start = time.time()
    if r != size - 1:
        try:
            kd.allreduce(tf.ones([4]), name="never_tensor")
            raise AssertionError("a stalled allreduce returned")
        except tf.errors.AbortedError as e:
            assert "never_tensor" in str(e) and f"[{size - 1}]" in str(e), str(e)
            log("aborted after %.1f s" % (time.time() - start))
    else:
        time.sleep(5)
        try:
            kd.allreduce(tf.ones([4]), name="other_tensor")
            raise AssertionError("the engine should have been stopped")
        except (tf.errors.AbortedError, tf.errors.FailedPreconditionError) as e:
            assert "Stall shutdown" in str(e) or "shut down" in str(e), str(e)
    assert time.time() - start < 30


main(run)
