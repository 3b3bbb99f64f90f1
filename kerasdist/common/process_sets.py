"""Process sets: collectives among a subset of the ranks, as in Horovod.

Each process set has its own engine (thread, negotiation and transport over
its own MPI communicator), so that collectives on disjoint sets run at the
same time without waiting for each other. `global_process_set` (id 0) is
every rank, and the default of every collective's `process_set` argument.

Every rank calls `add_process_set()` and `remove_process_set()`, in the
same order (as in Horovod's dynamic mode); the ranks agree on each call
through the global engine, so a rank that calls them differently gets a
clear error instead of a hang.
"""

import ctypes
import faulthandler
import pickle

from kerasdist.common import handles
from kerasdist.common.context import check_initialized, context


class ProcessSet:
    """A subset of the ranks that runs collectives on its own.

    Args:
        ranks_or_comm: A list of ranks (of `kerasdist.init`'s communicator),
            or an mpi4py communicator whose processes form the set (each
            rank may pass a different one, as from `MPI.COMM_WORLD.Split`).

    Attributes:
        ranks: The member ranks, sorted (`None` for a communicator until
            the set is registered).
        process_set_id: Its id once registered by `add_process_set` or
            `init(process_sets=...)`, else `None`.
        mpi_comm: The communicator it was made from, or `None`.

    Example:

    >>> even = kerasdist.add_process_set([0, 2])  # doctest: +SKIP
    >>> if even.included():  # doctest: +SKIP
    ...     kerasdist.allreduce(x, process_set=even)
    """

    def __init__(self, ranks_or_comm):
        self.process_set_id = None
        self.mpi_comm = None
        self.ranks = None
        if isinstance(ranks_or_comm, (list, tuple, range)):
            ranks = list(ranks_or_comm)
            if not ranks or not all(isinstance(r, int) and not isinstance(r, bool)
                                    and r >= 0 for r in ranks) or len(set(ranks)) != len(ranks):
                raise ValueError(
                    "Invalid value for argument `ranks_or_comm` of `ProcessSet`. Expected "
                    "a non-empty list of distinct non-negative integer ranks, or an mpi4py "
                    f"communicator. Received: {ranks_or_comm!r}")
            self.ranks = sorted(ranks)
        elif hasattr(ranks_or_comm, "Get_group") and hasattr(ranks_or_comm, "py2f"):
            self.mpi_comm = ranks_or_comm
        else:
            raise TypeError(
                "Invalid type for argument `ranks_or_comm` of `ProcessSet`. Expected a "
                f"list of ranks or an mpi4py communicator. Received: {ranks_or_comm!r}")

    def size(self):
        """The number of ranks in the set, or `None` if it is not registered."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self):
        """This process's rank within the set (-1 if it is not in it), or
        `None` if the set is not registered. Collectives still take ranks of
        the whole job as `root_rank`, as in Horovod."""
        if self.process_set_id is None:
            return None
        check_initialized()
        return self.ranks.index(context.rank) if context.rank in self.ranks else -1

    def included(self):
        """Whether this process belongs to the set (`None` before it has
        ranks)."""
        if self.ranks is None:
            return None
        check_initialized()
        return context.rank in self.ranks

    def __repr__(self):
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")


class _GlobalProcessSet(ProcessSet):
    """Every rank; id 0. Its `ranks` follow the current `init()`."""

    def __init__(self):  # pylint: disable=super-init-not-called
        self.process_set_id = 0
        self.mpi_comm = None

    @property
    def ranks(self):
        return list(range(context.size)) if context.initialized else None

    @ranks.setter
    def ranks(self, value):
        del value  # fixed: every rank


global_process_set = _GlobalProcessSet()


def _comm_ranks(comm):
    """The ranks of `comm`'s processes in kerasdist's communicator."""
    from mpi4py import MPI

    group = comm.Get_group()
    mine = context.comm.Get_group()
    ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), mine)
    group.Free()
    mine.Free()
    if any(r == MPI.UNDEFINED for r in ranks):
        raise ValueError("The communicator of a `ProcessSet` holds processes outside "
                         "kerasdist's communicator (`init(comm)`).")
    return sorted(ranks)


def _agree(kind, payload):
    """Every rank's (kind, next id, payload), checked to be the same call."""
    mine = (kind, context.next_process_set_id, payload)
    everyone = [pickle.loads(b) for b in handles.allgather_bytes(
        pickle.dumps(mine), f"kerasdist.process_sets.{kind}")]
    kinds = {(k, n) for k, n, _ in everyone}
    if len(kinds) != 1:
        detail = "; ".join(f"rank {r}: {k} (set #{n})" for r, (k, n, _) in enumerate(everyone))
        raise ValueError("Every rank must call add_process_set / remove_process_set "
                         f"identically and in the same order. Received: {detail}")
    return [p for _, _, p in everyone]


def _register(sets):
    """Registers `sets` (a list of ProcessSet, the same on every rank, or
    one communicator-made set per rank); returns them with their ids."""
    size = context.size
    lists, problem = [], None
    # A bad set on one rank is reported on every rank, after the agreement
    # below, so that no rank is left waiting in it.
    for ps in sets:
        ranks = []
        try:
            if ps.process_set_id is not None:
                raise ValueError(f"{ps!r} is registered already.")
            ranks = _comm_ranks(ps.mpi_comm) if ps.mpi_comm is not None else ps.ranks
            if any(r >= size for r in ranks):
                raise ValueError(f"Invalid ranks for a process set: {ranks}. Expected "
                                 f"ranks in [0, {size}).")
        except ValueError as e:
            problem = problem or str(e)
        lists.append(ranks)
    everyone = _agree("add", (problem, [(ps.mpi_comm is not None, ranks)
                                        for ps, ranks in zip(sets, lists)]))
    problems = [(r, p) for r, (p, _) in enumerate(everyone) if p]
    if problems:
        raise ValueError("add_process_set failed: "
                         + "; ".join(f"rank {r}: {p}" for r, p in problems))
    everyone = [calls for _, calls in everyone]
    if len({len(p) for p in everyone}) != 1:
        raise ValueError("Every rank must register the same number of process sets. "
                         f"Received: {[len(p) for p in everyone]} by rank.")
    # Each position i is one call: the same ranks everywhere, or (from a
    # communicator) each rank's own set, which together split the ranks.
    plan = []  # per call: the distinct sets in order of their lowest rank
    for i in range(len(sets)):
        per_rank = [p[i] for p in everyone]
        if not any(from_comm for from_comm, _ in per_rank):
            bad = [r for r, (_, ranks) in enumerate(per_rank) if ranks != per_rank[0][1]]
            if bad:
                raise ValueError(
                    "Every rank must pass the same ranks to add_process_set. Received: "
                    + "; ".join(f"rank {r}: {per_rank[r][1]}" for r in [0] + bad))
            plan.append([per_rank[0][1]])
            continue
        distinct = sorted({tuple(ranks) for _, ranks in per_rank}, key=min)
        for r, (_, ranks) in enumerate(per_rank):
            if r not in ranks or any(per_rank[q][1] != ranks for q in ranks):
                raise ValueError(
                    "The communicators of a ProcessSet(comm) call must split the ranks "
                    f"into disjoint sets, each rank in its own. Received: rank {r} in "
                    f"{ranks}, its members in {[per_rank[q][1] for q in ranks]}")
        plan.append([list(d) for d in distinct])
    registry = context.process_sets
    for ranks_list, ps, mine in zip(plan, sets, lists):
        for ranks in ranks_list:
            if any(p.ranks == ranks for p in registry.values()):
                raise ValueError(f"A process set with ranks {ranks} exists already.")
        for ranks in ranks_list:
            set_id = context.next_process_set_id
            context.next_process_set_id += 1
            _start(set_id, ranks, ps.mpi_comm if ranks == mine else None)
            if ranks == mine:
                ps.process_set_id = set_id
                ps.ranks = list(ranks)
                registry[set_id] = ps
            else:  # another rank's set of a split: known here by its ranks
                other = ProcessSet(ranks)
                other.process_set_id = set_id
                registry[set_id] = other
    return sets


def _start(set_id, ranks, user_comm):
    """Registers set `set_id` on this rank and, on its members, starts its
    engine over `user_comm` or a communicator made for it."""
    member = context.rank in ranks
    comm = user_comm
    made = None
    if member and comm is None:
        group = context.comm.Get_group().Incl(ranks)
        # Collective over the members only; all of them have just agreed
        # through the global engine, so none should be missing. MPI gives
        # no bound for it, so a watchdog does (as for MPI_Init): a member
        # lost in between ends this process with its stack printed.
        faulthandler.dump_traceback_later(context.config["init_timeout_s"], exit=True)
        try:
            made = comm = context.comm.Create_group(group, tag=set_id)
        finally:
            faulthandler.cancel_dump_traceback_later()
        group.Free()
    err = ctypes.create_string_buffer(4096)
    label = f"process set {set_id} (ranks {ranks}) "
    rc = context.lib.kerasdist_add_process_set(
        set_id, len(ranks), int(member), comm.py2f() if member else 0,
        int(context.config["init_timeout_s"] * 1000), label.encode(), err, len(err))
    if made is not None:
        made.Free()  # the engine works on its own duplicate
    if rc != 0:
        raise RuntimeError(f"Starting process set {set_id} (ranks {ranks}) failed: "
                           f"{err.value.decode()}")


def add_process_set(process_set):
    """Registers a process set; every rank calls it, in the same order.

    Args:
        process_set: A `ProcessSet`, or a list of ranks.

    Returns:
        The registered `ProcessSet`, with its `process_set_id`.

    Raises:
        ValueError: If the ranks disagree on the call, the ranks are out of
            range, or a set with these ranks exists.
    """
    check_initialized()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    return _register([ps])[0]


def remove_process_set(process_set):
    """Stops and forgets a process set; every rank calls it, in the same order.

    For sets made from a split communicator, each rank passes its own set:
    the sets of that split are removed together.

    Returns:
        True if the set was registered (and is now removed), else False.

    Raises:
        ValueError: For the global process set, or if the ranks disagree.
    """
    check_initialized()
    if process_set is global_process_set or getattr(process_set, "process_set_id", None) == 0:
        raise ValueError("The global process set cannot be removed.")
    set_id = getattr(process_set, "process_set_id", None)
    registry = context.process_sets
    known = set_id is not None and registry.get(set_id) is process_set
    ids = _agree("remove", set_id if known else None)
    distinct = set(ids)
    if len(distinct) > 1:
        # One split: each rank names its own set, and each set is named by
        # exactly its members.
        split = None not in distinct and all(
            i in registry and all(ids[q] == i for q in registry[i].ranks)
            and sorted(r for r, j in enumerate(ids) if j == i) == registry[i].ranks
            for i in distinct)
        if not split:
            raise ValueError("Every rank must remove the same process set (or, for a split "
                             "communicator, each its own). Received: "
                             + "; ".join(f"rank {r}: id {i}" for r, i in enumerate(ids)))
    if not known:
        return False
    for i in sorted(distinct):
        context.lib.kerasdist_remove_process_set(i)
        registry.pop(i).process_set_id = None
    return True


def resolve(process_set, what):
    """(id, ranks) of `process_set` for a collective run by this rank.

    Raises:
        ValueError: If it is not registered or this rank is not a member.
    """
    if process_set is None or process_set is global_process_set:
        return 0, None
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"Invalid type for argument `process_set` of `{what}`. Expected a "
                        f"kerasdist.ProcessSet. Received: {process_set!r}")
    set_id = process_set.process_set_id
    if set_id == 0:
        return 0, None
    if set_id is None or context.process_sets.get(set_id) is not process_set:
        raise ValueError(f"{process_set!r} is not registered. Call "
                         "`kerasdist.add_process_set()` on every rank first.")
    if context.rank not in process_set.ranks:
        raise ValueError(
            f"`{what}` on {process_set!r}: this rank ({context.rank}) is not in it. Run "
            "collectives on a process set only on its member ranks.")
    return set_id, process_set.ranks


def set_root(root_rank, process_set, what):
    """(set id, the root's rank within the set) for a broadcast."""
    set_id, ranks = resolve(process_set, what)
    members = ranks if ranks is not None else range(context.size)
    if not isinstance(root_rank, int) or isinstance(root_rank, bool) or root_rank not in members:
        expected = (f"one of the process set's ranks {ranks}" if ranks is not None
                    else f"an integer in [0, {context.size})")
        raise ValueError(
            f"Invalid value for argument `root_rank`. Expected {expected}. "
            f"Received: root_rank={root_rank!r}"
        )
    return set_id, (root_rank if ranks is None else ranks.index(root_rank))


def rank_size(set_id):
    """This rank's rank and the size in set `set_id` (0: global)."""
    if set_id == 0:
        return context.rank, context.size
    ranks = context.process_sets[set_id].ranks
    return ranks.index(context.rank), len(ranks)


def included(set_id):
    """Whether this rank is in set `set_id`; ValueError if unknown."""
    if set_id == 0:
        return True
    ps = context.process_sets.get(set_id)
    if ps is None:
        raise ValueError(f"Process set {set_id} does not exist.")
    return context.rank in ps.ranks


def by_id(set_id):
    """The registered ProcessSet with id `set_id` (0: the global set)."""
    return global_process_set if set_id == 0 else context.process_sets[set_id]
