"""Per-rank bootstrap of `kerasdist.run()`. Not a public API.

    python kerasdist/runner/run_worker.py PAYLOAD RESULT_DIR
    python -m kerasdist.runner.run_worker PAYLOAD RESULT_DIR

Loads the function and its arguments from `PAYLOAD`, calls it, and writes the
outcome to `RESULT_DIR/rank.<r>` (`r` is the MPI world rank), atomically:
a pickled dict of plain values, either `{"status": "ok", "value": bytes}`
(the return value, cloudpickled) or `{"status": "error", "type": str,
"message": str, "traceback": str, "time": float}` (when it failed, to tell
the first failure from the ones it caused), so the launcher can always read it. It also writes
`RESULT_DIR/pid.<r>` (host, pid, process group) at start, so the launcher can
stop the rank's processes on this host.

Run by file path (what `kerasdist.run()` does) it imports neither the
`kerasdist` package nor TensorFlow: the function imports what it needs. It
does not call `kerasdist.init()` (the function does), but shuts kerasdist
down at the end if the function left it initialized.
"""

import os
import pickle
import socket
import sys
import time
import traceback


def world_rank():
    """Returns this process's MPI world rank, from the launcher's variables."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    from mpi4py import MPI  # Unknown launcher: ask MPI (initializes it).

    return MPI.COMM_WORLD.Get_rank()


def _write_atomic(path, data):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _error_record(exc, skip_frames=0, context=None):
    """Describes `exc` with plain strings; drops `skip_frames` outer frames."""
    tb = exc.__traceback__
    for _ in range(skip_frames):
        tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    message = str(exc)
    if context:
        message = f"{context}: {message}" if message else context
    return {"status": "error", "type": type(exc).__qualname__,
            "message": message, "traceback": text, "time": time.time()}


def _extend_sys_path(caller_path):
    """Puts the caller's `sys.path` first, so that what the function's
    module-level references name is importable here too."""
    sys.path[:] = list(caller_path) + [p for p in sys.path
                                       if p not in caller_path]


def _shutdown_kerasdist():
    """Shuts kerasdist down if the function initialized it."""
    basics = sys.modules.get("kerasdist.common.basics")
    if basics is not None and basics.is_initialized():
        basics.shutdown()


def main(argv):
    if len(argv) != 2:
        print("usage: run_worker.py PAYLOAD RESULT_DIR", file=sys.stderr)
        return 2
    payload_path, result_dir = argv
    rank = world_rank()
    result_path = os.path.join(result_dir, f"rank.{rank}")
    _write_atomic(os.path.join(result_dir, f"pid.{rank}"), pickle.dumps(
        (socket.gethostname(), os.getpid(), os.getpgid(0))))

    try:
        with open(payload_path, "rb") as f:
            payload = pickle.load(f)
        _extend_sys_path(payload["sys_path"])
        import cloudpickle

        fn, args, kwargs = cloudpickle.loads(payload["call"])
    except BaseException as e:
        _write_atomic(result_path, pickle.dumps(_error_record(
            e, context="Could not load the function to run")))
        return 1

    try:
        value = fn(*args, **kwargs)
    except BaseException as e:
        # Record first: shutting down may fail too, once a peer is gone.
        _write_atomic(result_path, pickle.dumps(_error_record(e, 1)))
        sys.stdout.flush()
        try:
            _shutdown_kerasdist()
        except Exception:
            pass
        return 1

    ok = True
    try:
        data = pickle.dumps({"status": "ok", "value": cloudpickle.dumps(value)})
    except Exception as e:
        ok = False
        data = pickle.dumps(_error_record(
            e, context=f"The function returned a value of type "
            f"{type(value).__qualname__} that cloudpickle cannot serialize"))
    try:
        # Before writing the result: a failure here is this rank's failure.
        _shutdown_kerasdist()
    except Exception as e:
        ok = False
        data = pickle.dumps(_error_record(
            e, context="kerasdist.shutdown() failed after the function "
            "returned"))
    sys.stdout.flush()
    _write_atomic(result_path, data)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
