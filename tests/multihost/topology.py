"""Prints what one rank sees of the cluster as a `TOPO {json}` line.

Run under `tests/hosts.py`; the test compares the lines with the layout.
It also checks one exact allreduce and allgather, so that the links that
`transport_info()` names really carry data.
"""

import json
import os
import socket
import sys

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import kerasdist as kd
from kerasdist.common.basics import context


def main():
    kd.init()
    size, r = kd.size(), kd.rank()
    record = {
        "rank": r, "size": size,
        "local_rank": kd.local_rank(), "local_size": kd.local_size(),
        "cross_rank": kd.cross_rank(), "cross_size": kd.cross_size(),
        "hostname": socket.gethostname(),
        "processor": MPI.Get_processor_name(),
        "shm_files": sorted(os.listdir("/dev/shm")),
        "transport": kd.transport_info(),
        # KERASDIST_SPIN_MICROSECONDS unset: the engine's choice by topology.
        "spin_us": context.lib.kerasdist_spin_us(),
    }
    got = kd.allreduce(tf.constant(np.arange(1000, dtype=np.int64) * (r + 1)),
                       op=kd.Sum, name="topo.sum").numpy()
    np.testing.assert_array_equal(
        got, np.arange(1000, dtype=np.int64) * (size * (size + 1) // 2))
    hosts = kd.allgather_object(record["hostname"])
    record["hosts_seen"] = hosts
    sys.stdout.write("TOPO " + json.dumps(record) + "\n")
    sys.stdout.flush()


main()
