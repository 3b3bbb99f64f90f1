"""Process runtime: `init()`, `shutdown()`, and the rank/size queries.

All state lives in one explicit `Context` object (`context`, defined in
kerasdist/common/context.py and exported here too). The C++ engine behind
it keeps its own single Context, created by `init()`. Nothing here imports
a framework: what `init()` needs from one, the registered framework
bindings do (kerasdist/common/bindings.py).
"""

import atexit
import ctypes
import time

from kerasdist.common import bindings, library
from kerasdist.common import process_sets as _sets
from kerasdist.common.config import read_config
from kerasdist.common.context import Context, check_initialized, context  # noqa: F401


_COMM_TAG = 32108  # init(comm=[...])'s agreement, on MPI.COMM_WORLD
_INIT_ROLL_TAG = 32107  # the engine's roll call after an init() timeout


def _agree_on_ranks(world, ranks, timeout_s):
    """Checks, with a bound, that every listed rank passed the same list.

    `Create_group` hangs when the members pass different groups, so the
    members first exchange their lists point to point on `COMM_WORLD`. A rank
    that sees a different list tells the others that agreed with it, so every
    member fails at once; a member that never calls fails the others after
    `timeout_s`.
    """
    from mpi4py import MPI

    me = world.Get_rank()
    peers = [r for r in ranks if r != me]

    def send(peer, message):
        # Small messages: MPI sends them eagerly. Freeing the request leaves
        # nothing for MPI_Finalize to trip over; the buffer stays alive.
        buf = bytearray(repr(message).encode())
        request = world.Isend([buf, MPI.BYTE], dest=peer, tag=_COMM_TAG)
        if not request.Test():
            context.sent_buffers.append(buf)
            request.Free()

    for r in peers:
        send(r, ("ranks", ranks))
    pending, problem = set(peers), None
    deadline = time.monotonic() + timeout_s
    while pending and problem is None and time.monotonic() < deadline:
        # Only from the listed ranks: a message from any other is meant for
        # a later init(comm) of its own.
        status = MPI.Status()
        if not any(world.Iprobe(source=r, tag=_COMM_TAG, status=status) for r in peers):
            time.sleep(0.001)
            continue
        buf = bytearray(status.Get_count(MPI.BYTE))
        world.Recv([buf, MPI.BYTE], source=status.Get_source(), tag=_COMM_TAG)
        kind, value = _parse_message(bytes(buf))
        src = status.Get_source()
        if kind == "ranks" and value == ranks:
            pending.discard(src)
        elif kind == "ranks":
            problem = f"world rank {src} passed comm={value} and world rank {me} comm={ranks}"
            for r in peers:
                if r != src:
                    send(r, ("differ", problem))
        else:
            problem = value
    if problem is not None or pending:
        context.stray_messages = True
    if problem is not None:
        raise ValueError(
            "Invalid value for argument `comm`: every listed rank must pass "
            f"the same list to init(comm), but {problem}.")
    if pending:
        raise RuntimeError(
            f"kerasdist.init() failed: world ranks {sorted(pending)} are in "
            f"comm={ranks} but did not call init(comm) with it within "
            f"{timeout_s:g} s (KERASDIST_INIT_TIMEOUT_SECONDS).")


def _drop_stray_messages(bound_s=0.2, quiet_s=0.05):
    """Receives and drops what failed agreements left on `COMM_WORLD`.

    MPICH's `MPI_Finalize` fails on a `COMM_WORLD` that still holds
    unreceived messages, and Hydra then kills every rank of the job.
    """
    from mpi4py import MPI

    if MPI.Is_finalized() or not MPI.Is_initialized():
        return
    world = MPI.COMM_WORLD
    start = last = time.monotonic()
    while True:
        status = MPI.Status()
        if not any(world.Iprobe(source=MPI.ANY_SOURCE, tag=t, status=status)
                   for t in (_COMM_TAG, _INIT_ROLL_TAG)):
            now = time.monotonic()
            if now - start >= bound_s or now - last >= quiet_s:
                return
            time.sleep(0.001)
            continue
        world.Recv([bytearray(status.Get_count(MPI.BYTE)), MPI.BYTE],
                   source=status.Get_source(), tag=status.Get_tag())
        last = time.monotonic()


def _parse_message(data):
    import ast

    try:
        kind, value = ast.literal_eval(data.decode())
        return str(kind), value
    except (ValueError, SyntaxError, UnicodeDecodeError, TypeError):
        return "corrupt", "an unreadable message on kerasdist's tag"


def _resolve_comm(comm, timeout_s=300.0):
    from mpi4py import MPI

    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, MPI.Comm):
        return comm
    if isinstance(comm, (list, tuple)):
        world = MPI.COMM_WORLD
        ranks = [int(r) for r in comm]
        if sorted(set(ranks)) != sorted(ranks) or not ranks or any(
            r < 0 or r >= world.Get_size() for r in ranks
        ):
            raise ValueError(
                "Invalid value for argument `comm`. Expected a list of distinct "
                f"world ranks in [0, {world.Get_size()}). Received: comm={comm!r}"
            )
        if world.Get_rank() not in ranks:
            raise ValueError(
                f"This process (world rank {world.Get_rank()}) is not in "
                f"`comm`={ranks}; only the listed ranks may call init(comm)."
            )
        _agree_on_ranks(world, ranks, timeout_s)
        group = world.Get_group().Incl(ranks)
        return world.Create_group(group)
    raise TypeError(
        "Invalid type for argument `comm`. Expected an mpi4py communicator, "
        f"a list of ranks, or None. Received: comm={comm!r}"
    )


def _package_version():
    try:
        from kerasdist import _build_info
    except ImportError:
        return "unknown"
    return _build_info.KERASDIST_VERSION


def init(comm=None, process_sets=None):
    """Initializes kerasdist and starts its background engine.

    Safe to call more than once; later calls do nothing. After `shutdown()`,
    `init()` starts a fresh engine. Every rank of `comm` must call it.

    Args:
        comm: The processes to train with: an mpi4py communicator, a list of
            world ranks, or `None` for `MPI.COMM_WORLD`. Defaults to `None`.
        process_sets: A list of `kerasdist.ProcessSet` to register now (as
            `add_process_set` would, on every rank), or `"dynamic"` (accepted
            for Horovod compatibility: sets can always be added later).
            Defaults to `None`.

    Raises:
        ValueError: If `comm` or a `KERASDIST_*` variable is invalid, or the
            listed ranks passed different lists (on every one of them).
        RuntimeError: If the other ranks do not join within
            `KERASDIST_INIT_TIMEOUT_SECONDS`.
    """
    ctx = context
    if ctx.initialized:
        return
    if process_sets not in (None, "dynamic") and not isinstance(process_sets, (list, tuple)):
        raise ValueError(
            "Invalid value for argument `process_sets`. Expected a list of "
            f"kerasdist.ProcessSet, 'dynamic' or None. Received: {process_sets!r}")
    config = read_config()
    if not ctx.atexit_registered:
        # Before the engine starts: a failed init() must bound the exit too.
        atexit.register(_shutdown_at_exit)
        ctx.atexit_registered = True
    mpi_comm = _resolve_comm(comm, config["init_timeout_s"])
    err = ctypes.create_string_buffer(4096)
    c = library.Config()
    ctx.lib.kerasdist_config_defaults(ctypes.byref(c))
    c.fusion_threshold_bytes = config["fusion_threshold"]
    c.fusion_tensor_limit_bytes = config["fusion_tensor_limit"]
    c.cycle_time_us = int(config["cycle_time_ms"] * 1000)
    c.stall_warning_us = int(config["stall_check_s"] * 1e6)
    c.stall_shutdown_us = int(config["stall_shutdown_s"] * 1e6)
    c.deadlock_us = int(config["deadlock_s"] * 1e6)
    c.timeout_ms = int(config["timeout_s"] * 1000)
    c.init_timeout_ms = int(config["init_timeout_s"] * 1000)
    c.segment_bytes = config["segment_bytes"]
    c.cache_capacity = config["cache_capacity"]
    c.small_allreduce_bytes = config["small_allreduce_bytes"]
    c.spin_us = config["spin_us"]
    c.direct_allreduce_bytes = config["direct_allreduce_bytes"]
    c.direct_group_bytes = config["direct_group_bytes"]
    c.shared_memory = int(config["shared_memory"])
    c.hierarchical = config["hierarchical"]
    c.timeline_path = config["timeline"].encode()
    c.version = _package_version().encode()
    rc = ctx.lib.kerasdist_init(mpi_comm.py2f(), ctypes.byref(c), err, len(err))
    if rc != 0:
        ctx.stray_messages = True  # the roll call after a timeout
        raise RuntimeError(f"kerasdist.init() failed: {err.value.decode()}")
    ctx.comm = mpi_comm
    ctx.rank, ctx.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    # The engine learned the topology in its bounded setup exchange (ranks
    # on one host share a host name), so no blocking MPI collective runs
    # here, while the engine thread already uses MPI.
    topo = (ctypes.c_int32 * 6)()
    ctx.lib.kerasdist_topology(topo)
    ctx.local_rank, ctx.local_size, ctx.cross_rank, ctx.cross_size = topo[:4]
    ctx.homogeneous = bool(topo[4])
    ctx.hierarchical = bool(topo[5])
    ctx.config = config
    ctx.name_counters = {}
    ctx.pending = {}  # handles of an earlier init() are void, as in Horovod
    ctx.pending_names = {}
    ctx.initialized = True
    bindings.after_init(ctx)  # e.g. TensorFlow's thread pools
    if isinstance(process_sets, (list, tuple)) and process_sets:
        _sets._register(list(process_sets))


# How long exiting may take after a failed collective before the process
# ends itself (see kerasdist_exit_guard in csrc/capi/process.cc).
_EXIT_BOUND_SECONDS = 5.0


def _shutdown_at_exit():
    shutdown()
    # Another rank's failed agreement may have sent here too: always look.
    _drop_stray_messages(0.2 if context.stray_messages else 0.0)
    context.lib.kerasdist_exit_guard(_EXIT_BOUND_SECONDS)


def shutdown():
    """Stops the engine on this rank and tells the other ranks to stop.

    Collectives still waiting on any rank fail with an error instead of
    hanging. Safe to call more than once; `init()` may be called again after.
    """
    ctx = context
    if not ctx.initialized:
        return
    ctx.lib.kerasdist_shutdown()
    ctx.initialized = False
    for ps in ctx.process_sets.values():
        ps.process_set_id = None
    ctx.process_sets = {}
    ctx.next_process_set_id = 1


def is_initialized():
    """Returns True between `init()` and `shutdown()`."""
    return context.initialized


def _query(attr):
    check_initialized()
    return getattr(context, attr)


def rank():
    """Returns this process's rank in `[0, size())`."""
    return _query("rank")


def size():
    """Returns the number of processes."""
    return _query("size")


def local_rank():
    """Returns this process's rank among the processes on its host."""
    return _query("local_rank")


def local_size():
    """Returns the number of processes on this host."""
    return _query("local_size")


def cross_rank():
    """Returns the index of this host among the hosts (ranks with the same
    local rank, ordered by rank)."""
    return _query("cross_rank")


def cross_size():
    """Returns the number of hosts with a process of this local rank."""
    return _query("cross_size")


def transport_info():
    """Describes how this rank's engine moves data.

    Returns:
        A string naming the MPI library and, when ring links on this host
        use shared memory (`KERASDIST_SHM`), which ones, e.g.
        `"mpi(MPICH Version: 5.0.2); shared memory to rank 1, from rank 1"`,
        followed by `"; hierarchical allreduce"` when allreduces reduce
        within each host first (`KERASDIST_HIERARCHICAL_ALLREDUCE`).
    """
    check_initialized()
    buf = ctypes.create_string_buffer(1024)
    context.lib.kerasdist_transport_name(buf, len(buf))
    info = buf.value.decode()
    if context.hierarchical:
        info += "; hierarchical allreduce"
    return info


def build_info():
    """Describes the build: versions, library path and ops.

    Returns:
        A dict with `kerasdist_version`, `library_path` (the engine
        library), `c_api_version` and `mpi_library`, and the entries of each
        loaded framework binding: the TensorFlow binding adds `tf_version`,
        `tf_built_against`, `op_library_path` and `ops`.
    """
    from mpi4py import MPI

    from kerasdist import _build_info

    info = {
        "kerasdist_version": _build_info.KERASDIST_VERSION,
        "library_path": context.library_path,
        "c_api_version": context.lib.kerasdist_api_version(),
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
    }
    for binding in bindings.registered():
        if binding.build_info is not None:
            info.update(binding.build_info())
    return info
