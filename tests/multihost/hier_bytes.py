"""Bytes each host sends to other hosts for one 64 MiB allreduce, flat ring
against hierarchical, in one job (kerasdist is re-initialised in between).

Args (argv): modes, e.g. `0 1` (values of KERASDIST_HIERARCHICAL_ALLREDUCE).
For each mode: init, a warmup allreduce (negotiation, allocation), then,
between MPI barriers, the lowest rank of each host reads its `eth0`
counters (/proc/net/dev is per network namespace) around one checked
allreduce. Prints `HIERBYTES mode=<m> host=<name> tx=<bytes> rx=<bytes>
info=<transport_info()>` on those ranks.
"""

import os
import socket
import sys

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import kerasdist as kd

N = 16 << 20  # float32: 64 MiB


def counters():
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "eth0":
                fields = rest.split()
                return int(fields[0]), int(fields[8])
    raise RuntimeError("no eth0 here")


comm = MPI.COMM_WORLD
names = comm.allgather(socket.gethostname())
leader = names.index(names[comm.rank]) == comm.rank
want = comm.size * (comm.size + 1) / 2
for mode in sys.argv[1:] or ["0", "1"]:
    os.environ["KERASDIST_HIERARCHICAL_ALLREDUCE"] = mode
    kd.init()
    x = tf.fill([N], float(comm.rank + 1))
    kd.allreduce(x, op=kd.Sum, name=f"hb.{mode}").numpy()
    comm.Barrier()
    before = counters() if leader else None
    y = kd.allreduce(x, op=kd.Sum, name=f"hb.{mode}").numpy()
    comm.Barrier()
    if leader:
        rx, tx = (a - b for a, b in zip(counters(), before))
        print(f"HIERBYTES mode={mode} host={names[comm.rank]} tx={tx} rx={rx} "
              f"info={kd.transport_info()}", flush=True)
    np.testing.assert_array_equal(y[::4096], np.full(N // 4096, want, np.float32))
    del x, y
    kd.shutdown()
print(f"[rank {comm.rank}] hier_bytes done", flush=True)
