"""Rank side of `benchmarks/multihost.py` (run under mpiexec on test hosts).

Usage: `_multihost_rank.py --sizes 4K 1M ... [--target-s 1.0] [--max-iters N]`.
Measures, per float32 buffer size and in this order of passes:
- `flat`: kerasdist with KERASDIST_HIERARCHICAL_ALLREDUCE=0, and MPICH's
  `MPI_Allreduce` (mpi4py, numpy buffers), interleaved per size;
- `hier`: kerasdist re-initialised with KERASDIST_HIERARCHICAL_ALLREDUCE=1.
kerasdist runs k allreduces inside one `tf.function` (the while loop of
`benchmarks/allreduce.py`). Each method and size: a warmup, an estimate,
then one timed loop of `iters` ops (about `--target-s` seconds) between
barriers. The time per op is the slowest rank's loop time / iters. Around
that loop the lowest rank of each host reads its `eth0` counters from
/proc/net/dev (per network namespace), so bytes per op count what the host
really sent to and received from other hosts (barriers included, a few
hundred bytes). Every kerasdist path is checked once per size against the
exact sum. Rank 0 prints one `MHROW <json>` line per method and size.
"""

import argparse
import json
import os
import socket
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce import make_loop_fn, parse_size, rank_data  # noqa: E402


def link_counters(dev="eth0"):
    """(rx_bytes, tx_bytes) of `dev` in this process's network namespace."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == dev:
                fields = rest.split()
                return int(fields[0]), int(fields[8])
    return 0, 0


class Meter:
    """Times `op(k)` (k back-to-back ops) and counts the hosts' link bytes."""

    def __init__(self, comm, args):
        from mpi4py import MPI

        self.comm, self.MAX, self.args = comm, MPI.MAX, args
        names = comm.allgather(socket.gethostname())
        self.hosts = sorted(set(names), key=names.index)
        self.leader = names.index(names[comm.rank]) == comm.rank

    def measure(self, op):
        op(1)  # tracing, allocation, negotiation
        self.comm.Barrier()
        t0 = time.perf_counter()
        op(1)
        est = self.comm.allreduce(time.perf_counter() - t0, op=self.MAX)
        iters = int(min(self.args.max_iters, max(self.args.min_iters,
                                                 round(self.args.target_s / max(est, 1e-6)))))
        self.comm.Barrier()
        before = link_counters() if self.leader else None
        t0 = time.perf_counter()
        op(iters)
        took = time.perf_counter() - t0
        self.comm.Barrier()
        after = link_counters() if self.leader else None
        took = self.comm.allreduce(took, op=self.MAX)
        deltas = self.comm.gather(
            None if before is None else [(a - b) / iters for a, b in zip(after, before)])
        per_host = [d for d in deltas or [] if d is not None]
        return {"seconds": took / iters, "iters": iters,
                "host_rx_bytes": [d[0] for d in per_host],
                "host_tx_bytes": [d[1] for d in per_host]}


def kd_pass(mode, comm, meter, args):
    """Initialises kerasdist in `mode` ('flat' or 'hier') and measures every
    size (with MPICH alongside in the flat pass); yields rows."""
    import kerasdist as kd
    import tensorflow as tf
    from mpi4py import MPI

    os.environ["KERASDIST_HIERARCHICAL_ALLREDUCE"] = "1" if mode == "hier" else "0"
    kd.init()
    info = kd.transport_info()
    size = comm.Get_size()
    for nbytes in args.sizes:
        n = nbytes // 4
        loop_fn = make_loop_fn(kd, tf, f"mh.{mode}.{nbytes}", chain=1)
        local, exact = rank_data(n, comm)
        got = kd.allreduce(tf.constant(local), op=kd.Sum, name=f"mh.check.{mode}.{nbytes}")
        ok = bool(np.array_equal(got.numpy(), exact))
        if not all(comm.allgather(ok)):
            raise AssertionError(f"{mode}: wrong sum at {nbytes} bytes")
        zeros = tf.zeros([n])
        methods = [(mode, lambda k: loop_fn(zeros, k))]
        if mode == "flat":
            send, recv = np.ones(n, np.float32), np.zeros(n, np.float32)

            def mpich(k):
                for _ in range(k):
                    comm.Allreduce(send, recv, op=MPI.SUM)
            methods.append(("mpich", mpich))
        for name, op in methods:
            row = meter.measure(op)
            row.update(method=name, bytes=nbytes, ranks=size,
                       busbw_GBps=nbytes * 2 * (size - 1) / size / row["seconds"] / 1e9)
            if name != "mpich":
                row["transport"] = info
            yield row
    kd.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", type=parse_size, required=True)
    p.add_argument("--target-s", type=float, default=1.0)
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=300)
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    meter = Meter(comm, args)
    for mode in ("flat", "hier"):
        for row in kd_pass(mode, comm, meter, args):
            if comm.rank == 0:
                row["hosts"] = meter.hosts
                sys.stdout.write("MHROW " + json.dumps(row) + "\n")
                sys.stdout.flush()


main()
