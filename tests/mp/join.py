"""join(): a rank out of data contributes zeros and is left out of averages;
join() returns the rank that joined last."""

import time

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def run():
    size, r = kd.size(), kd.rank()
    steps = r + 2  # rank r has r + 2 batches
    for i in range(steps):
        avg = kd.allreduce(tf.fill([3], float(r + 1)), op=kd.Average, name=f"grad.{i}")
        total = kd.allreduce(tf.fill([2], 1), op=kd.Sum, name=f"count.{i}")
        active = [k for k in range(size) if k + 2 > i]
        want = sum(k + 1 for k in active) / len(active)
        np.testing.assert_allclose(avg.numpy(), np.full(3, want))
        np.testing.assert_array_equal(total.numpy(), np.full(2, len(active)))
    if r == 0:
        time.sleep(0.5)  # rank 0 is not the last one to join
    last = kd.join()
    assert last == size - 1 or (r == 0 and last in range(size)), last
    everyone = kd.allgather_object(last)
    assert len(set(everyone)) == 1, everyone
    # A second round of joins works too, and collectives work afterwards.
    assert kd.join() in range(size)
    out = kd.allreduce(tf.ones([4]), op=kd.Sum, name="after_join")
    np.testing.assert_array_equal(out.numpy(), np.full(4, size, np.float32))
    check_reused_name_after_join(size, r)
    log("join ok, last", last)


def check_reused_name_after_join(size, r):
    """A name every rank has cached, then run by the last rank alone with
    another description while the others have joined, then by every rank
    with the first description again. The joined ranks must not send their
    stale cache id (rank 0 caches the newer description under it), which
    failed as a mismatch before (found by the 100,000-op soak)."""
    for _ in range(2):  # cached after the first round
        got = kd.allreduce(tf.constant(3, tf.int8), op=kd.Sum, name="reused").numpy()
        assert got == 3 * size, got
    if r == size - 1:
        x = tf.fill([9], tf.constant(1.5, tf.bfloat16))
        got = kd.allreduce(x, op=kd.Sum, prescale_factor=2.0, name="reused")
        np.testing.assert_array_equal(tf.cast(got, tf.float32).numpy(), np.full(9, 3.0))
    kd.join()
    for _ in range(2):
        got = kd.allreduce(tf.constant(3, tf.int8), op=kd.Sum, name="reused").numpy()
        assert got == 3 * size, got


main(run)
