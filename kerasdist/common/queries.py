"""Horovod's build and run-time queries that need no framework: the
backends kerasdist is built with, MPI's thread level, the hosts' topology
and the timeline.

The query ops that read the context inside a `tf.function` (`rank_op()`,
...) are TensorFlow ops: `kerasdist.tensorflow.queries`.
"""

import os

from kerasdist.common.context import check_initialized, context


def checked_set_id(process_set_id, process_set):
    """The id of the process set given by id or object, for the query ops
    (`size_op`, ...); raises ValueError if it is not registered."""
    check_initialized()
    if process_set is not None:
        set_id = getattr(process_set, "process_set_id", None)
        if set_id is None:
            raise ValueError(f"{process_set!r} is not registered. Call "
                             "`kerasdist.add_process_set()` first.")
        return set_id
    if not isinstance(process_set_id, int) or (
            process_set_id != 0 and process_set_id not in context.process_sets):
        raise ValueError(
            "Invalid value for argument `process_set_id`. Expected 0 or the id of a "
            f"registered process set ({sorted(context.process_sets)}). "
            f"Received: process_set_id={process_set_id!r}")
    return process_set_id


def is_homogeneous():
    """Returns True if every host runs the same number of processes."""
    check_initialized()
    return bool(context.homogeneous)


def mpi_threads_supported():
    """Returns True if MPI runs at `MPI_THREAD_MULTIPLE` (kerasdist's engine
    requires it, so this is True once initialized)."""
    check_initialized()
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled():
    """Returns True: MPI is kerasdist's only controller and transport."""
    return True


def mpi_built():
    """Returns True: kerasdist is always built with MPI."""
    return True


def gloo_enabled():
    """Returns False: kerasdist has no Gloo backend."""
    return False


def gloo_built():
    """Returns False: kerasdist has no Gloo backend."""
    return False


def nccl_built():
    """Returns 0 (Horovod returns the NCCL version): no NCCL support."""
    return 0


def ddl_built():
    """Returns False: no IBM DDL support."""
    return False


def ccl_built():
    """Returns False: no oneCCL support."""
    return False


def cuda_built():
    """Returns False: kerasdist's ops run on the CPU only."""
    return False


def rocm_built():
    """Returns False: kerasdist's ops run on the CPU only."""
    return False


def _timeline_path():
    return context.config.get("timeline", "") if context.config else ""


def start_timeline(file_path, mark_cycles=False):
    """Horovod's `start_timeline`; kerasdist's timeline is fixed at `init()`.

    The engine opens its timeline (rank 0 writes it) when it starts, from
    `KERASDIST_TIMELINE` (`kerasdist-run --timeline-filename F`), and
    writes it until `shutdown()`; it has no hook to start one later. So this
    succeeds only when that timeline is already being written to
    `file_path`, and raises otherwise.

    Args:
        file_path: The timeline's path.
        mark_cycles: Unused (kerasdist has no fixed cycle to mark).
            Defaults to False.

    Raises:
        RuntimeError: If the engine is not writing a timeline to
            `file_path`.
    """
    check_initialized()
    del mark_cycles
    current = _timeline_path()
    if current and os.path.abspath(current) == os.path.abspath(os.fspath(file_path)):
        return
    raise RuntimeError(
        "kerasdist cannot start a timeline at run time: the engine opens it "
        "when it starts. Set KERASDIST_TIMELINE=" + os.fspath(file_path) +
        " before `kerasdist.init()` (or run `kerasdist-run "
        "--timeline-filename " + os.fspath(file_path) + " ...`). "
        + (f"The engine is writing a timeline to {current!r}." if current else
           "No timeline is being written."))


def stop_timeline():
    """Horovod's `stop_timeline`; kerasdist's timeline ends at `shutdown()`.

    Does nothing when no timeline is being written.

    Raises:
        RuntimeError: If a timeline is being written (it cannot be closed
            before `kerasdist.shutdown()`).
    """
    check_initialized()
    current = _timeline_path()
    if current:
        raise RuntimeError(
            f"kerasdist cannot stop its timeline ({current!r}) at run time: "
            "the engine writes it from `init()` until `kerasdist.shutdown()`, "
            "which closes it. Call `kerasdist.shutdown()`, or leave "
            "KERASDIST_TIMELINE unset for a run without a timeline.")
