"""Runs one rank's command for `kerasdist-run` and stops the job if it fails.

    python kerasdist/runner/supervise.py -- <command> [args...]

`kerasdist-run` starts every rank through this small supervisor (it only
imports the standard library, so it starts in a few milliseconds). The
supervisor runs the command as its child, in the same process group, with
its standard streams and every inherited descriptor (the MPI process
manager's PMI connection included), and:

- forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to it;
- makes the kernel kill the child if the supervisor dies first
  (`PR_SET_PDEATHSIG`), so the child never outlives it;
- exits with the child's status when it succeeds, or when it fails after a
  stop signal was forwarded (the job is being stopped already);
- otherwise, when the child exits non-zero or is killed by a signal, writes
  one line to standard error naming the rank, its host and the status, then
  dies from a signal. MPI process managers (MPICH's Hydra, Open MPI) tear
  the whole job down when a process dies from a signal, but Hydra lets the
  other ranks run on (e.g. wait in `init()`) after a plain non-zero exit.
  `kerasdist-run` reads the line and exits with the child's own status.
"""

import ctypes
import os
import resource
import signal
import socket
import subprocess
import sys

_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
_STOPPING = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
_PR_SET_PDEATHSIG = 1
REPORT_PREFIX = "kerasdist-run: rank "
REPORT_SUFFIX = "; stopping the job."


def rank_and_host(environ):
    """Returns this rank's `(rank, host)` as strings, from the MPI's variables.

    `host` is the name the process manager placed the rank on (Hydra's
    `PMI_HOSTNAME`), else this machine's host name. `rank` is `"?"` outside
    an MPI job.
    """
    rank = "?"
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if environ.get(name, "").isdigit():
            rank = environ[name]
            break
    return rank, environ.get("PMI_HOSTNAME") or socket.gethostname()


def describe(status):
    """Describes a `subprocess` return code: `"exited with code 3"` or
    `"was killed by signal 9 (SIGKILL)"`."""
    if status >= 0:
        return f"exited with code {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = "unknown"
    return f"was killed by signal {-status} ({name})"


def _child_setup(parent, blocked):
    """Runs in the child between fork and exec."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # The supervisor died before prctl().
        os._exit(1)


def supervise(command, environ=None):
    """Runs `command` as described in the module docstring.

    A signal from the supervisor's own parent (the MPI process manager) is
    not forwarded: Hydra signals the rank's whole process group, so the
    child has it already (twice would stop a handler half-way).

    Args:
        command: The argv list to run.
        environ: Mapping to read the rank and host from. Defaults to
            `os.environ`. The child always inherits `os.environ`.

    Returns:
        The status to exit with: the child's exit code (or 128 + N if a
        stop signal came and the child died from signal N). When the child
        failed on its own this function does not return: the supervisor
        kills itself.
    """
    environ = os.environ if environ is None else environ
    parent, stopping = os.getpid(), []
    manager = os.getppid()
    forwarded = {getattr(signal, name) for name in _FORWARDED
                 if signal.getsignal(getattr(signal, name)) != signal.SIG_IGN}
    waited = forwarded | {signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    try:
        proc = subprocess.Popen(command, close_fds=False, preexec_fn=lambda:
                                _child_setup(parent, waited))
    except OSError as e:
        status, detail = 127 if isinstance(e, FileNotFoundError) else 126, (
            f" (could not start {command[0]!r}: {e.strerror or e})")
    else:
        detail = ""
        while proc.poll() is None:  # The child's lifetime, in bounded waits.
            info = signal.sigtimedwait(waited, 1.0)
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            if signal.Signals(info.si_signo).name in _STOPPING:
                stopping.append(info.si_signo)
            if info.si_pid != manager:
                try:
                    proc.send_signal(info.si_signo)
                except OSError:
                    pass
        status = proc.returncode
    if status == 0 or stopping:
        return status if status >= 0 else 128 - status
    rank, host = rank_and_host(environ)
    line = (f"{REPORT_PREFIX}{rank} (host {host}) {describe(status)}{detail}"
            f"{REPORT_SUFFIX}\n")
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    try:
        os.write(2, line.encode(errors="replace"))
    except OSError:
        pass
    try:  # No core file of the supervisor for SIGSEGV, SIGABRT, ...
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError):
        pass
    # Die from the child's own signal (as it did), else from SIGKILL.
    if status < 0 and -status != signal.SIGKILL:
        try:
            signal.signal(-status, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [-status])
            os.kill(os.getpid(), -status)
        except (OSError, ValueError):
            pass
    os.kill(os.getpid(), signal.SIGKILL)
    return 128 + signal.SIGKILL  # Not reached.


def main(argv=None):
    """Entry point: `supervise.py -- command [args...]`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("Missing command to run. Usage: python supervise.py -- "
              "command [args...]", file=sys.stderr)
        return 2
    return supervise(argv)


if __name__ == "__main__":
    sys.exit(main())
