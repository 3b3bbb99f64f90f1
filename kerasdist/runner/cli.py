"""`kerasdist-run`: runs a command on several MPI ranks, e.g.

    kerasdist-run -np 4 -H host1:2,host2:2 python train.py --epochs 3

Every rank runs under a small supervisor (supervise.py, in this folder) that
stops the whole job when the rank fails; `--max-restarts` then starts the
job again. It imports only the standard library and `kerasdist.runner`,
never TensorFlow or the ops; `python -m kerasdist.runner` runs it too.
"""

import argparse
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

from kerasdist.runner import hosts as _hosts
from kerasdist.runner import restarts as _restarts
from kerasdist.runner import supervise as _supervise
from kerasdist.runner.check_build import check_build
from kerasdist.runner.relay import _Sink, hydra_pattern

_PROG = "kerasdist-run"
_HYDRA_PATTERN = hydra_pattern()  # Without a token: `kerasdist.run()`.
_SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "supervise.py")
# The line a supervisor writes when its rank fails (see supervise.py).
_REPORT = re.compile(
    re.escape(_supervise.REPORT_PREFIX) + r"(\d+) \(host (.*)\) "
    r"(?:exited with code (\d+)|was killed by signal (\d+) \(\w+\))(.*)"
    + re.escape(_supervise.REPORT_SUFFIX) + r"\r?\n?")
_RESTART_PAUSE_SECONDS = 1.0
# (flag, Namespace attribute, type, must be > 0, environment variable, help)
_SETTINGS = (
    ("--timeline-filename", "timeline", str, None, "KERASDIST_TIMELINE",
     "Write a timeline of the collective ops to this file."),
    ("--fusion-threshold-mb", "fusion_mb", float, False,
     "KERASDIST_FUSION_THRESHOLD", "Tensor fusion buffer size, in MB."),
    ("--cycle-time-ms", "cycle_ms", float, True, "KERASDIST_CYCLE_TIME",
     "Engine cycle time, in milliseconds."),
    ("--stall-check-warning-time-seconds", "stall_warning", int, False,
     "KERASDIST_STALL_CHECK_TIME_SECONDS", "Warn about ops stalled this long."),
    ("--stall-check-shutdown-time-seconds", "stall_shutdown", int, False,
     "KERASDIST_STALL_SHUTDOWN_TIME_SECONDS", "Abort if stalled this long."),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ValueError(message)


def _make_parser():
    p = _Parser(prog=_PROG, allow_abbrev=False,
                description="Run a command on several MPI ranks.")
    p.add_argument("-np", "--num-proc", dest="np", metavar="N",
                   help="Number of ranks.")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="E.g. `host1:2,host2:2`.")
    hosts.add_argument("--hostfile", metavar="FILE", help="MPI hostfile.")
    for flag, dest, _, _, _, help_text in _SETTINGS:
        metavar = {"timeline": "FILE", "fusion_mb": "MB", "cycle_ms": "MS"}
        p.add_argument(flag, dest=dest, help=help_text,
                       metavar=metavar.get(dest, "SECONDS"))
    p.add_argument("--max-restarts", metavar="N", default="0",
                   help="Restart the whole job up to N times when a rank "
                        "fails (default: 0).")
    p.add_argument("--min-np", metavar="M",
                   help="With hosts known, a restart may leave out a host "
                        "that failed twice in a row if M ranks remain.")
    p.add_argument("--output-filename", metavar="DIR",
                   help="Also write each rank's output to DIR/rank.<r>/.")
    p.add_argument("--verbose", action="store_true",
                   help="Print the mpiexec command before running it.")
    p.add_argument("--check-build", action="store_true",
                   help="Print how kerasdist was built and exit.")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="Command to run on every rank.")
    return p


def _check_number(args, dest, flag, kind, positive):
    raw = getattr(args, dest)
    try:
        value = kind(raw)
        ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    except ValueError:
        ok = False
    if not ok:
        what = ("a positive" if positive else "a non-negative") + (
            " integer" if kind is int else " number")
        raise ValueError(f"Invalid value for argument `{flag}`. Expected "
                         f"{what}. Received: {flag}={raw}")
    setattr(args, dest, value)


def parse_args(argv):
    """Parses and validates `kerasdist-run` command-line arguments.

    Args:
        argv: List of arguments, without the program name.

    Returns:
        An `argparse.Namespace`; numbers are converted, `command` is the
        user's command, untouched.

    Raises:
        ValueError: If an argument is missing or invalid.
    """
    args = _make_parser().parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if args.check_build:
        return args
    if args.np is None:
        raise ValueError("Missing required argument `-np` (number of ranks).")
    _check_number(args, "np", "-np", int, True)
    for flag, dest, kind, positive, _, _ in _SETTINGS:
        if kind is not str and getattr(args, dest) is not None:
            _check_number(args, dest, flag, kind, positive)
    _check_number(args, "max_restarts", "--max-restarts", int, False)
    if args.min_np is not None:
        _check_number(args, "min_np", "--min-np", int, True)
        if args.min_np > args.np:
            raise ValueError("Invalid value for argument `--min-np`. Expected "
                             f"at most -np={args.np}. Received: "
                             f"--min-np={args.min_np}")
    args.host_list = None  # [(host, slots)] from -H or --hostfile
    if args.hosts is not None:
        args.host_list = _hosts.parse_hosts(args.hosts)
    if args.hostfile is not None:
        if not os.path.isfile(args.hostfile):
            raise ValueError("Invalid value for argument `--hostfile`. Expected "
                             "an existing file. Received: "
                             f"--hostfile={args.hostfile}")
        with open(args.hostfile) as f:
            args.host_list = _hosts.parse_hostfile(f.read(), args.hostfile)
    if not args.command:
        raise ValueError(f"Missing command to run. Example: `{_PROG} -np 2 "
                         "python train.py`.")
    return args


def settings_env(args):
    """Returns the `KERASDIST_*` variables set by command-line options."""
    env = {}
    for _, dest, kind, _, name, _ in _SETTINGS:
        value = getattr(args, dest)
        if value is not None and dest == "fusion_mb":
            value = int(value * 1024 * 1024)  # The engine wants bytes.
        elif value is not None and kind is float and value.is_integer():
            value = int(value)
        if value is not None:
            env[name] = str(value)
    return env


def build_env(args, base_env, extra_env=None):
    """Builds the environment of the `mpiexec` process.

    Args:
        args: Namespace returned by `parse_args`.
        base_env: Mapping to start from (e.g. `os.environ`); not modified.
        extra_env: More variables for the ranks (e.g. `KERASDIST_RESTART`).

    Returns:
        A new dict: `base_env` updated with the `KERASDIST_*` settings.
    """
    return {**base_env, **settings_env(args), **(extra_env or {})}


def build_mpiexec_argv(args, mpiexec_path, flavor="mpich", placement=None,
                       token="", supervise=False, extra_env=None):
    """Builds the `mpiexec` command line (an argv list: no shell involved).

    Args:
        args: Namespace returned by `parse_args`.
        mpiexec_path: Path of the `mpiexec` executable.
        flavor: `"mpich"` (Hydra) or `"openmpi"`.
        placement: `(host, ranks)` pairs, one contiguous block of ranks per
            host; the number of ranks is their sum. Defaults to the `-H` or
            `--hostfile` hosts (see `hosts.place`) with `args.np` ranks, or
            no host option at all.
        token: Random part of Hydra's output tag (see `relay`).
        supervise: Run every rank under kerasdist/runner/supervise.py.
        extra_env: More variables to forward to the ranks.

    Returns:
        The argv list, ending with the user's command verbatim. Settings are
        forwarded explicitly (`-genv`/`-x`) so that remote ranks get them.

    Raises:
        ValueError: If `flavor` is unknown.
    """
    env = {**settings_env(args), **(extra_env or {})}
    host_list = getattr(args, "host_list", None)
    if placement is None and host_list:
        placement = _hosts.place(host_list, args.np)
    np = sum(n for _, n in placement) if placement else args.np
    hosts = ["-hosts" if flavor == "mpich" else "-H",
             _hosts.format_hosts(placement)] if placement else []
    if flavor == "mpich":
        argv = [mpiexec_path, "-n", str(np),
                "-prepend-pattern", hydra_pattern(token), *hosts]
        for name, value in env.items():
            argv += ["-genv", name, value]
    elif flavor == "openmpi":
        argv = [mpiexec_path, "--allow-run-as-root", "--oversubscribe",
                "--tag-output", "-np", str(np), *hosts]
        for name in env:
            argv += ["-x", name]
    else:
        raise ValueError("Invalid value for argument `flavor`. Expected "
                         f"'mpich' or 'openmpi'. Received: flavor={flavor}")
    if supervise:
        argv += [sys.executable, _SUPERVISOR, "--"]
    return argv + list(args.command)


def resolve_hosts(args, environ):
    """Returns `(hosts, source)`: the `(host, slots)` pairs from `-H`,
    `--hostfile` or, without either, the Slurm allocation in `environ`; or
    `(None, None)` (the local host).

    Raises:
        ValueError: If the Slurm variables are malformed.
    """
    if args.host_list:
        return args.host_list, "-H" if args.hosts is not None else "--hostfile"
    slurm = _hosts.slurm_hosts(environ)
    return (slurm, "the Slurm allocation") if slurm else (None, None)


def find_mpiexec():
    """Returns this Python environment's `mpiexec`, else the one on PATH.

    Raises:
        FileNotFoundError: If there is no `mpiexec`.
    """
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(local) and os.access(local, os.X_OK):
        return local
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(f"Could not find `mpiexec`, neither at {local} "
                                "nor on PATH. Try `pip install mpich`.")
    return found


def detect_flavor(mpiexec_path):
    """Returns `"openmpi"` if `mpiexec --version` says so, else `"mpich"`."""
    try:
        out = subprocess.run([mpiexec_path, "--version"], capture_output=True,
                             text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "mpich"
    return "openmpi" if "Open MPI" in out.stdout + out.stderr else "mpich"


def _terminal_group(fd=0):
    """Returns the terminal's foreground process group if `fd` is a tty."""
    try:
        return os.tcgetpgrp(fd) if os.isatty(fd) else None
    except OSError:
        return None


class _Forwarder:
    """Forwards SIGINT/SIGTERM to the running mpiexec; remembers that one came
    (then the job is not restarted)."""

    def __init__(self):
        self.proc, self.early, self.stopped = None, [], False

    def __call__(self, signum, frame):
        self.stopped = True
        if signum == signal.SIGINT and _terminal_group() == os.getpgrp():
            return  # The terminal delivered this Ctrl-C to mpiexec too.
        if self.proc is None:
            self.early.append(signum)  # Sent once Popen returns.
            return
        try:
            self.proc.send_signal(signum)
        except OSError:  # mpiexec already exited.
            pass

    def started(self, proc):
        self.proc = proc
        for signum in self.early:
            self(signum, None)
        self.early = []


def _parse_report(rank, line):
    """Returns `(rank, host, status, text)` if `line` is a supervisor's report
    of its own rank's failure (`status`: exit code, or minus the signal)."""
    match = _REPORT.fullmatch(line.decode(errors="replace"))
    if not match or int(match.group(1)) != rank:
        return None
    code, sig = match.group(3), match.group(4)
    text = match.group(0).strip()[len(_supervise.REPORT_PREFIX):
                                  -len(_supervise.REPORT_SUFFIX)]
    return rank, match.group(2), int(code) if code else -int(sig), f"rank {text}"


def _run_once(args, mpiexec, flavor, placement, np, attempt, forwarder):
    """Runs the job once; returns `(exit status, first failure report)`."""
    token = os.urandom(4).hex()
    extra = {"KERASDIST_RESTART": str(attempt)} if attempt else {}
    argv = build_mpiexec_argv(args, mpiexec, flavor, placement, token=token,
                              supervise=True, extra_env=extra)
    if args.verbose:
        if placement:
            print(f"{_PROG}: hosts: {_hosts.format_hosts(placement)}",
                  file=sys.stderr)
        for name, value in {**settings_env(args), **extra}.items():
            print(f"{_PROG}: {name}={value}", file=sys.stderr)
        shown = shlex.join(argv).replace("\x1e", r"\x1e").replace("\x1f", r"\x1f")
        print(f"{_PROG}: running: {shown}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    failures = []

    def observe(rank, line):
        report = _parse_report(rank, line)
        if report:
            failures.append(report)

    sinks = [_Sink(stream, name, args.output_filename, np, append=attempt > 0,
                   observe=observe, hold_banner=True)
             for stream, name in ((sys.stdout, "stdout"), (sys.stderr, "stderr"))]
    # Hydra relays a terminal stdin only from the foreground process group.
    # Otherwise give mpiexec its own group so that each signal reaches it
    # once, through us: Hydra turns a second SIGINT into a forced abort.
    own_group = {}
    if _terminal_group() is None:
        own_group = ({"process_group": 0} if sys.version_info >= (3, 11)
                     else {"preexec_fn": os.setpgrp})
    proc = subprocess.Popen(argv, env=build_env(args, os.environ, extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            **own_group)
    forwarder.started(proc)
    threads = [threading.Thread(target=sink.pump, args=(pipe, flavor, token),
                                daemon=True)
               for sink, pipe in zip(sinks, (proc.stdout, proc.stderr))]
    for t in threads:
        t.start()
    code = proc.wait()
    forwarder.proc = None
    for t in threads:  # Bounded: a stray proxy might keep a pipe open.
        t.join(timeout=10)
    for sink in sinks:  # Hydra's banner names the supervisor's signal.
        sink.finish(drop_banner=bool(failures))
    code = 128 - code if code < 0 else code
    if code and failures:
        status = failures[0][2]
        code = status if status > 0 else 128 - status
    return code, (failures[0] if code and failures else None)


def launch(args):
    """Runs `args.command` on `args.np` ranks, relaying their output.

    Every rank runs under kerasdist/runner/supervise.py, so the whole job stops
    as soon as one rank fails. With `args.max_restarts`, a failed job is
    started again (see `restarts.RestartPolicy`).

    Args:
        args: Namespace returned by `parse_args`.

    Returns:
        0, or the first failing rank's exit code (128 + N if it was killed
        by signal N), or mpiexec's own status.

    Raises:
        FileNotFoundError: If there is no `mpiexec`.
        ValueError: If the Slurm variables are malformed.
    """
    mpiexec = find_mpiexec()
    flavor = detect_flavor(mpiexec)
    hosts, source = resolve_hosts(args, os.environ)
    if args.verbose and source:
        print(f"{_PROG}: hosts from {source}: {_hosts.format_hosts(hosts)}",
              file=sys.stderr)
    policy = _restarts.RestartPolicy(args.np, hosts, args.max_restarts,
                                     args.min_np)
    forwarder, previous = _Forwarder(), {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, forwarder)
    try:
        while True:
            code, failure = _run_once(args, mpiexec, flavor, policy.placement,
                                      policy.np, policy.restarts, forwarder)
            if code == 0 or forwarder.stopped:
                return code
            why = failure[3] if failure else f"mpiexec exited with status {code}"
            restart, notes = policy.after_failure(failure and failure[0])
            if not restart:
                left = " (no restarts left)" if args.max_restarts else ""
                print(f"{_PROG}: error: {why}; the job failed{left}.",
                      file=sys.stderr, flush=True)
                return code
            for note in notes:
                print(f"{_PROG}: {note}", file=sys.stderr)
            print(f"{_PROG}: {why}; restarting the job (restart "
                  f"{policy.restarts} of {args.max_restarts}).",
                  file=sys.stderr, flush=True)
            time.sleep(_RESTART_PAUSE_SECONDS)
            if forwarder.stopped:
                return code
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv=None):
    """Entry point of `kerasdist-run`; returns the process exit status."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        _make_parser().print_usage(sys.stderr)
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 2
    if args.check_build:
        return check_build()
    try:
        return launch(args)
    except ValueError as e:  # Malformed Slurm variables.
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # No mpiexec, unwritable --output-filename, ...
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 1


if __name__ == "__main__":
    sys.exit(main())
