"""Large float32 allreduces checked exactly against numpy.

Args (argv): sizes in MiB, e.g. `1 16 64`. Each rank's data is a cheap
integer formula, so every rank can build the expected sum without holding
all ranks' buffers. Prints `BIG <MiB> <seconds>` per size (information
only, not asserted).
"""

import sys
import time

import numpy as np
import tensorflow as tf

import kerasdist as kd

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/mp")
from _util import log, main  # noqa: E402


def rank_data(n, r):
    # Small integers: every partial sum is exact in float32.
    i = np.arange(n, dtype=np.int64)
    return ((i * 7 + r * 13) % 61 - 30).astype(np.float32)


def run():
    size, r = kd.size(), kd.rank()
    for mib in [int(a) for a in sys.argv[1:]] or [64]:
        n = mib * (1 << 20) // 4
        want = np.zeros(n, np.float32)
        for k in range(size):
            want += rank_data(n, k)
        x = tf.constant(rank_data(n, r))
        for rep in range(2):
            start = time.perf_counter()
            y = kd.allreduce(x, op=kd.Sum, name=f"big.{mib}.{rep}")
            got = y.numpy()
            took = time.perf_counter() - start
            if not np.array_equal(got, want):
                bad = np.flatnonzero(got != want)
                raise AssertionError(
                    f"{mib} MiB: {bad.size} wrong elements, first at {bad[0]}: "
                    f"got {got[bad[0]]} want {want[bad[0]]}")
            log(f"BIG {mib} {took:.4f}")
        del want, x, y, got


main(run)
