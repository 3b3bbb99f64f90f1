"""The shared-memory ring links, with every link on, some or all off.

KD_TEST_SHM_OFF lists world ranks that start with KERASDIST_SHM=0 ("all"
for every rank). Links that touch such a rank must fall back to MPI on both
ends, and every result must still be exact.
"""

import os

from mpi4py import MPI

_off = os.environ.get("KD_TEST_SHM_OFF", "")
_world = MPI.COMM_WORLD
if _off == "all" or str(_world.Get_rank()) in _off.split(","):
    os.environ["KERASDIST_SHM"] = "0"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist as kd  # noqa: E402
from _util import log, main  # noqa: E402

# Element counts around the 64 KiB slot and 1 MiB channel of float32, so
# that messages end mid-slot, fill slots exactly and wrap the queue.
COUNTS = [0, 1, 5, 16384, 16385, 300001, (1 << 20) + 3]


def expected_links(size, rank, off):
    """Which ring links of this rank should use shared memory."""
    on = lambda r: not (off == "all" or str(r) in off.split(","))  # noqa: E731
    right, left = (rank + 1) % size, (rank - 1) % size
    return on(rank) and on(right), on(rank) and on(left)


def run():
    size, r = kd.size(), kd.rank()
    info = kd.transport_info()
    log("transport:", info)
    to_right, from_left = expected_links(size, r, _off)
    assert (f"to rank {(r + 1) % size}" in info) == to_right, info
    assert (f"from rank {(r - 1) % size}" in info) == from_left, info
    rng = np.random.default_rng(7)
    for rnd in range(2):
        for n in COUNTS:
            data = [rng.integers(-8, 8, n).astype(np.float32) for _ in range(size)]
            got = kd.allreduce(tf.constant(data[r]), op=kd.Sum, name=f"s{rnd}.{n}")
            np.testing.assert_array_equal(got.numpy(), np.sum(data, axis=0))
        # float16 and int8 reduce fragment by fragment as they arrive.
        h = [rng.integers(-4, 4, 70001).astype(np.float16) for _ in range(size)]
        got = kd.allreduce(tf.constant(h[r]), op=kd.Max, name=f"h{rnd}")
        np.testing.assert_array_equal(got.numpy(), np.max(h, axis=0))
        i8 = [rng.integers(-3, 3, 140003).astype(np.int8) for _ in range(size)]
        got = kd.allreduce(tf.constant(i8[r]), op=kd.Min, name=f"i{rnd}")
        np.testing.assert_array_equal(got.numpy(), np.min(i8, axis=0))
        rows = [(k * 50000) % 70001 for k in range(size)]
        parts = [np.full([rows[k], 3], k, np.int64) for k in range(size)]
        got = kd.allgather(tf.constant(parts[r]), name=f"g{rnd}")
        np.testing.assert_array_equal(got.numpy(), np.concatenate(parts))
        for root in range(size):
            b = np.arange(500001, dtype=np.float64) * (root + 1)
            got = kd.broadcast(tf.constant(b if r == root else np.zeros_like(b)), root,
                               name=f"b{rnd}.{root}")
            np.testing.assert_array_equal(got.numpy(), b)
        # A fresh engine maps fresh segments.
        kd.shutdown()
        kd.init()
    log("shm checks passed")


main(run)
