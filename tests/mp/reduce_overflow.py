"""Reductions with values chosen to overflow the element type part way.

Averages accumulate where the mean fits: uint8 [200, 200] averages to 200
(it wrapped to 72 at every hop before), int32 averages of 2e9 stay exact,
float16 averages of 60000 stay finite. Sums keep numpy's semantics for the
element type: integer sums wrap modulo 2^bits, exactly as numpy's do.
"""

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def check(x, op, want, name):
    got = kd.allreduce(tf.constant(x), op=op, name=name).numpy()
    np.testing.assert_array_equal(got, want, err_msg=name)


def run():
    size, r = kd.size(), kd.rank()
    n = 70001  # more than one fragment and segment
    for dtype, big in [(np.uint8, 200), (np.int8, 120), (np.int8, -120)]:
        x = np.full(n, big, dtype)
        check(x, kd.Average, np.full(n, big, dtype), f"avg.{np.dtype(dtype).name}.{big}")
        # numpy: the sum of the ranks' arrays in the element type (wraps).
        want = np.sum(np.stack([x] * size).astype(np.int64), axis=0).astype(dtype)
        check(x, kd.Sum, want, f"sum.{np.dtype(dtype).name}.{big}")
    mixed = (np.arange(n) % 256).astype(np.uint8)
    per_rank = [np.roll(mixed, k) for k in range(size)]
    want = np.trunc(np.mean(np.stack(per_rank).astype(np.int64), axis=0)).astype(np.uint8)
    check(per_rank[r], kd.Average, want, "avg.uint8.mixed")
    x = np.full(n, 2_000_000_000, np.int32)
    check(x, kd.Average, x, "avg.int32.big")
    h = np.full(n, 60000, np.float16)
    got = kd.allreduce(tf.constant(h), op=kd.Average, name="avg.f16.big").numpy()
    assert np.isfinite(got).all(), got[:4]
    np.testing.assert_allclose(got.astype(np.float32), 60000, rtol=2e-3)
    # A sum that really exceeds float16's range is inf, as numpy's is.
    got = kd.allreduce(tf.constant(h), op=kd.Sum, name="sum.f16.big").numpy()
    assert np.isinf(got).all(), got[:4]
    # Fused (grouped) averages take the same path.
    outs = kd.grouped_allreduce([tf.constant(np.full(5, 250, np.uint8)),
                                 tf.constant(np.full(3, 7, np.uint8))], op=kd.Average,
                                name="avg.grouped")
    np.testing.assert_array_equal(outs[0].numpy(), np.full(5, 250, np.uint8))
    np.testing.assert_array_equal(outs[1].numpy(), np.full(3, 7, np.uint8))
    log("overflow checks passed")


main(run)
