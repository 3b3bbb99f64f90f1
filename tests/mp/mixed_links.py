"""Rings whose links mix shared memory and MPI, with tensors that overflow
every window.

Rank 1 starts with KERASDIST_SHM=0, so at np=3 the ring is 2->0 over shared
memory and 0->1, 1->2 over MPI. A rank waiting on one kind of link must keep
the other moving: before that was so, a 64 MiB allreduce stalled here (and
on two hosts with two ranks each) until the transfer timeout.
"""

import os

from mpi4py import MPI

if MPI.COMM_WORLD.Get_rank() == 1:
    os.environ["KERASDIST_SHM"] = "0"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist as kd  # noqa: E402
from _util import log, main  # noqa: E402

MIB = 1 << 20


def run():
    size, r = kd.size(), kd.rank()
    info = kd.transport_info()
    log("transport:", info)
    assert ("shared memory" in info) == (r != 1 and size > 2), info
    for mib in (16, 64):
        n = mib * MIB // 4
        x = (np.arange(n, dtype=np.float32) % 251) * (r + 1)
        got = kd.allreduce(tf.constant(x), op=kd.Sum, name=f"mixed.ar.{mib}")
        want = (np.arange(n, dtype=np.float32) % 251) * (size * (size + 1) // 2)
        np.testing.assert_array_equal(got.numpy(), want)
        parts = [np.full([mib * MIB // 8 // (k + 1)], k, np.int64) for k in range(size)]
        got = kd.allgather(tf.constant(parts[r]), name=f"mixed.ag.{mib}")
        np.testing.assert_array_equal(got.numpy(), np.concatenate(parts))
        b = np.arange(n, dtype=np.float32)
        got = kd.broadcast(tf.constant(b if r == 2 else np.zeros_like(b)), 2,
                           name=f"mixed.bc.{mib}")
        np.testing.assert_array_equal(got.numpy(), b)
    log("mixed links passed")


main(run)
