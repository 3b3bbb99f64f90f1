"""Point-to-point latency and bandwidth between 2 ranks, for the models in
README.md, "Cost at scale" (alpha: one hop's latency, beta: seconds per
byte).

    mpiexec -n 2 python benchmarks/mpi_pingpong.py [--iters 2000] [--json PATH]

Rank 0 sends, rank 1 sends back; one-way time is half the round trip. Per
size, the median over blocks of `iters` round trips (plus warm-up) is
reported: the machine is shared, the median resists others' bursts.
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

SIZES = [8, 64, 512, 4096, 65536, 1 << 20, 16 << 20]


def one_way(comm, nbytes, iters, blocks=7):
    buf = np.zeros(max(1, nbytes), dtype=np.uint8)
    peer = 1 - comm.rank
    n = max(4, iters if nbytes <= 65536 else iters // 50)
    results = []
    for b in range(blocks + 1):  # the first block warms up
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            if comm.rank == 0:
                comm.Send([buf, nbytes, MPI.BYTE], dest=peer, tag=1)
                comm.Recv([buf, nbytes, MPI.BYTE], source=peer, tag=1)
            else:
                comm.Recv([buf, nbytes, MPI.BYTE], source=peer, tag=1)
                comm.Send([buf, nbytes, MPI.BYTE], dest=peer, tag=1)
        if b:
            results.append((time.perf_counter() - t0) / n / 2)
    return statistics.median(results)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--json")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        sys.exit("run on exactly 2 ranks")
    rows = [{"bytes": s, "one_way_us": one_way(comm, s, args.iters) * 1e6} for s in SIZES]
    if comm.rank == 0:
        for r in rows:
            bw = r["bytes"] / (r["one_way_us"] * 1e-6) / 1e9
            print(f"{r['bytes']:>10} B  one-way {r['one_way_us']:9.2f} us  {bw:7.3f} GB/s")
        big = rows[-1]
        alpha = rows[0]["one_way_us"]
        beta_ns = (big["one_way_us"] - alpha) * 1e3 / big["bytes"]
        print(f"alpha ~ {alpha:.2f} us (8 B one-way), beta ~ {beta_ns:.4f} ns/B "
              f"({1 / beta_ns:.2f} GB/s) from {big['bytes'] >> 20} MiB")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"mpi": MPI.Get_library_version().splitlines()[0], "rows": rows,
                           "alpha_us": alpha, "beta_ns_per_byte": beta_ns}, f, indent=1)


if __name__ == "__main__":
    main()
