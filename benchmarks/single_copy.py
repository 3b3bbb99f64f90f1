"""Single-copy (CMA) against the shared-memory staging copy, on one host.

Run on 2 ranks of one host: `mpiexec -n 2 python benchmarks/single_copy.py
[--sizes 256K 4M] [--iters N] [--json PATH]` (or under `kerasdist-run`).

The engine moves ring data between ranks of one host through shared-memory
slots: the sender copies into a slot, the receiver copies (or reduces) out of
it. Linux's cross-memory attach (`process_vm_readv`, "CMA") lets the receiver
read the sender's buffer directly instead, saving the sender's copy. Whether
that pays depends on how fast the kernel's copy is, which this measures on
rank 1, for a buffer rank 0 has just written (as a ring's sender has):

- `CMA read`: `process_vm_readv` of rank 0's private buffer, in pieces of
  `--piece` bytes (the engine's ring segment, 256 KiB);
- `shm copy-out`: `memcpy` out of a buffer in `/dev/shm` that rank 0 wrote
  (the receiver's half of the staged path);
- `local memcpy`: `memcpy` between two buffers of rank 1's own.

Methods are interleaved sample by sample; each sample is the best of
`--repeat` copies of a freshly written buffer, the reported time the median of
`--iters` samples. Rank 1 checks every byte it read. Prints a table, writes
JSON with `--json`.
"""

import argparse
import ctypes
import datetime
import json
import mmap
import os
import platform
import socket
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce import fmt_size, parse_size  # noqa: E402

DEFAULT_SIZES = ["256K", "1M", "4M", "16M", "64M"]


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.restype = ctypes.c_ssize_t
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_ulong,
                                   ctypes.POINTER(IoVec), ctypes.c_ulong, ctypes.c_ulong]


def cma_read(pid, dst, remote_addr, nbytes, piece):
    """Reads `nbytes` at `remote_addr` of process `pid` into numpy `dst`."""
    local, remote = IoVec(), IoVec()
    base = dst.ctypes.data
    for off in range(0, nbytes, piece):
        n = min(piece, nbytes - off)
        local.base, local.len = base + off, n
        remote.base, remote.len = remote_addr + off, n
        got = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got != n:
            err = ctypes.get_errno()
            raise OSError(err, f"process_vm_readv of {n} bytes returned {got}: "
                               f"{os.strerror(err)}")


def shared_buffer(comm, nbytes):
    """A /dev/shm buffer both ranks map (rank 0 creates and removes it)."""
    path = None
    if comm.rank == 0:
        path = f"/dev/shm/kerasdist-single-copy-{os.getpid()}"
        with open(path, "wb") as f:
            f.truncate(nbytes)
    path = comm.bcast(path, root=0)
    with open(path, "r+b") as f:
        mem = mmap.mmap(f.fileno(), nbytes)
    comm.Barrier()
    if comm.rank == 0:
        os.unlink(path)
    return mem, np.frombuffer(mem, np.uint8)


def bench_size(comm, nbytes, args, peer_pid):
    private = np.zeros(nbytes, np.uint8)
    mem, shared = shared_buffer(comm, nbytes)
    addr = comm.bcast(private.ctypes.data if comm.rank == 0 else None, root=0)
    dst = np.zeros(nbytes, np.uint8)
    local_src = np.ones(nbytes, np.uint8)
    times = {"CMA read": [], "shm copy-out": [], "local memcpy": []}
    cma_error = None
    value = 0
    for it in range(args.iters):
        for method in times:
            best = float("inf")
            for _ in range(args.repeat):
                value = (value + 1) % 251
                if comm.rank == 0 and method != "local memcpy":
                    (private if method == "CMA read" else shared).fill(value)
                comm.Barrier()
                if comm.rank == 1 and not (method == "CMA read" and cma_error):
                    t = time.perf_counter()
                    try:
                        if method == "CMA read":
                            cma_read(peer_pid, dst, addr, nbytes, args.piece)
                        elif method == "shm copy-out":
                            np.copyto(dst, shared)
                        else:
                            np.copyto(dst, local_src)
                    except OSError as e:  # CMA forbidden: say so, keep in step
                        cma_error = str(e)
                    else:
                        best = min(best, time.perf_counter() - t)
                        expect = 1 if method == "local memcpy" else value
                        if not np.all(dst == expect):
                            raise AssertionError(
                                f"{method} of {fmt_size(nbytes)} read wrong bytes")
                comm.Barrier()
            if comm.rank == 1 and best < float("inf"):
                times[method].append(best)
    del shared
    mem.close()
    result = comm.bcast({m: statistics.median(v) if v else None for m, v in times.items()}
                        if comm.rank == 1 else None, root=1)
    return result, comm.bcast(cma_error, root=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", type=parse_size,
                   default=[parse_size(s) for s in DEFAULT_SIZES])
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--piece", type=parse_size, default=parse_size("256K"))
    p.add_argument("--json", default=None)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    hosts = comm.allgather(socket.gethostname())
    if comm.size != 2 or hosts[0] != hosts[1]:
        if comm.rank == 0:
            print("single_copy.py needs exactly 2 ranks on one host. "
                  f"Received: {comm.size} ranks on {sorted(set(hosts))}", file=sys.stderr)
        sys.exit(2)
    peer_pid = comm.bcast(os.getpid() if comm.rank == 0 else None, root=0)
    rows, cma_error = [], None
    for nbytes in args.sizes:
        res, err = bench_size(comm, nbytes, args, peer_pid)
        cma_error = cma_error or err
        rows.append({"bytes": nbytes, "seconds": res})
    if comm.rank != 0:
        return
    methods = ["CMA read", "shm copy-out", "local memcpy"]
    print(f"Copy of a buffer rank 0 has just written, timed on rank 1 "
          f"(median of {args.iters} samples, each the best of {args.repeat}; "
          f"CMA in pieces of {fmt_size(args.piece)})")
    print(f"{'size':>8} | " + " | ".join(f"{m:>20}" for m in methods) + " | CMA / shm time")
    for row in rows:
        cells = []
        for m in methods:
            s = row["seconds"][m]
            cells.append(f"{s * 1e6:9.1f} us {row['bytes'] / s / 1e9:5.1f} GB/s" if s
                         else f"{'n/a':>20}")
        cma, shm = row["seconds"]["CMA read"], row["seconds"]["shm copy-out"]
        ratio = f"{cma / shm:.2f}" if cma and shm else "n/a"
        print(f"{fmt_size(row['bytes']):>8} | " + " | ".join(cells) + f" | {ratio}")
    if cma_error:
        print(f"CMA not available: {cma_error}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                       "host": platform.node(), "cpus": os.cpu_count(),
                       "piece_bytes": args.piece, "iters": args.iters,
                       "repeat": args.repeat, "cma_error": cma_error, "rows": rows},
                      f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # not SystemExit: every rank exits then
        # The other rank would wait in a barrier for the failed one.
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(1)
