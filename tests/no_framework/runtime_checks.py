"""The framework-neutral runtime in a process where no framework imports.

Run alone, under mpiexec or kerasdist-run, with tests/no_framework on
PYTHONPATH: its sitecustomize makes `tensorflow`, `keras`, `torch` and
`jax` fail to import, as on a machine without them. Everything below must
still work, with real values checked on every rank.
"""

import sys

BLOCKED = ("tensorflow", "keras", "torch", "jax", "jaxlib", "tf_keras")
assert any(type(f).__name__ == "_Block" for f in sys.meta_path), "run with tests/no_framework on PYTHONPATH"

import kerasdist as kd

kd.init()
rank, size = kd.rank(), kd.size()
assert kd.is_initialized()
assert 0 <= rank < size
assert kd.local_size() == size and kd.local_rank() == rank, (kd.local_rank(), kd.local_size())
assert kd.cross_size() == 1 and kd.cross_rank() == 0
assert kd.mpi_built() and kd.mpi_enabled() and not kd.nccl_built() and not kd.gloo_built()
assert kd.is_homogeneous()
info = kd.build_info()
assert info["kerasdist_version"] and info["library_path"].endswith("libkerasdist.so") and info["c_api_version"] == 1 and "ops" not in info, info

gathered = kd.allgather_object({"rank": rank, "payload": list(range(rank * 1000))})
assert [g["rank"] for g in gathered] == list(range(size)), gathered
assert all(g["payload"] == list(range(r * 1000)) for r, g in enumerate(gathered))
root = size - 1
value = kd.broadcast_object(("from", rank, b"\x00" * 70000) if rank == root else None,
                            root_rank=root)
assert value == ("from", root, b"\x00" * 70000), value[:2]
kd.barrier()

kd.barrier(name="named barrier")
if size > 1:
    evens = kd.add_process_set([r for r in range(size) if r % 2 == 0])
    assert evens.included() == (rank % 2 == 0)
    if evens.included():
        got = kd.allgather_object(rank, process_set=evens)
        assert got == [r for r in range(size) if r % 2 == 0], got
    kd.remove_process_set(evens)

kd.shutdown()
assert not kd.is_initialized()
kd.init()
assert kd.allgather_object(rank) == list(range(size))
kd.shutdown()
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not leaked, leaked
print(f"rank {rank}: no-framework runtime ok", flush=True)
