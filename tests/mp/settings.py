"""Settings that shape the wire must agree: a rank started with another
KERASDIST_SEGMENT_BYTES (and KERASDIST_SMALL_ALLREDUCE_BYTES, KERASDIST_FUSION_TENSOR_LIMIT,
KERASDIST_DIRECT_GROUP_BYTES) makes init() fail on every rank, naming the setting
and the rank. The topology queries come from the same setup exchange."""

import os
import socket
import sys

from mpi4py import MPI

world = MPI.COMM_WORLD
if sys.argv[1] == "mismatch" and world.Get_rank() == world.Get_size() - 1:
    os.environ["KERASDIST_SEGMENT_BYTES"] = "65536"
    os.environ["KERASDIST_SMALL_ALLREDUCE_BYTES"] = "0"
    os.environ["KERASDIST_FUSION_TENSOR_LIMIT"] = "0"
    os.environ["KERASDIST_DIRECT_GROUP_BYTES"] = "4096"

import kerasdist as kd  # noqa: E402
from kerasdist.common.basics import context  # noqa: E402

r = world.Get_rank()
if sys.argv[1] == "mismatch":
    try:
        kd.init()
    except RuntimeError as e:
        msg = str(e)
        last = world.Get_size() - 1
        assert "KERASDIST_SEGMENT_BYTES is 262144 on rank 0 but 65536 on rank " + str(last) in msg, msg
        assert "KERASDIST_SMALL_ALLREDUCE_BYTES is 32768 on rank 0 but 0 on rank " + str(last) in msg, msg
        assert "KERASDIST_FUSION_TENSOR_LIMIT is 1048576 on rank 0 but 0 on rank " + str(last) in msg, msg
        assert "KERASDIST_DIRECT_GROUP_BYTES is 1048576 on rank 0 but 4096 on rank " + str(last) in msg, msg
        print(f"[rank {r}] init refused: {msg}", flush=True)
        sys.exit(0)
    print(f"[rank {r}] FAILED: init() accepted differing settings", flush=True)
    sys.exit(1)

kd.init()
hosts = world.allgather(socket.gethostname())
same = [q for q in range(kd.size()) if hosts[q] == hosts[r]]
assert kd.local_rank() == same.index(r) and kd.local_size() == len(same)
peers = [q for q in range(kd.size())
         if [p for p in range(kd.size()) if hosts[p] == hosts[q]].index(q) == kd.local_rank()]
assert kd.cross_rank() == peers.index(r) and kd.cross_size() == len(peers)
# Every rank on this host: the engine spins by default (EngineConfig::spin_us);
# an explicit KERASDIST_SPIN_MICROSECONDS wins.
one_host = kd.local_size() == kd.size()
want_spin = int(os.environ.get("KERASDIST_SPIN_MICROSECONDS") or (30 if one_host else 0))
spin = context.lib.kerasdist_spin_us()
assert spin == want_spin, (spin, want_spin)
print(f"[rank {r}] topology ok", flush=True)
