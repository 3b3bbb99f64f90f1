"""Rank-side helper for tests/test_launcher.py (uses no kerasdist ops).

Prints `rank=<r>`, its arguments and `KERASDIST_*` variables as JSON lines.
Options (any other argument is just echoed back):
  --exit-rank=R --exit-code=C  rank R exits with status C.
  --split-line                 writes one line in two pieces, 0.2 s apart.
  --mpi                        prints the mpi4py world size.
  --wait-signal                prints "ready", then waits up to 20 s for
                               SIGINT/SIGTERM, reports it and exits 7.
"""

import json
import os
import signal
import sys
import time

rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
args = sys.argv[1:]
opts = dict(a[2:].partition("=")[::2] for a in args if a.startswith("--"))
env = {k: v for k, v in os.environ.items() if k.startswith("KERASDIST_")}
print(f"rank={rank}")
print("argv=" + json.dumps(args))
print("env=" + json.dumps(env, sort_keys=True))
print(f"stderr line from rank {rank}", file=sys.stderr)
sys.stdout.flush()
if "split-line" in opts:
    os.write(1, f"first half of rank {rank}".encode())
    time.sleep(0.2)
    os.write(1, b" + second half\n")
if "mpi" in opts:
    from mpi4py import MPI

    print(f"mpi_size={MPI.COMM_WORLD.Get_size()} mpi_rank={MPI.COMM_WORLD.Get_rank()}")
if "wait-signal" in opts:
    def handler(signum, frame):
        print(f"rank {rank} got signal {signum}", flush=True)
        sys.exit(7)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    print("ready", flush=True)
    time.sleep(20)
    sys.exit(0)
if opts.get("exit-rank") == str(rank):
    sys.exit(int(opts.get("exit-code", "1")))
