"""`kerasdist-run`: runs a command on several MPI ranks, e.g.

    kerasdist-run -np 4 -H host1:2,host2:2 python train.py --epochs 3

Importable and runnable as a plain script without TensorFlow or the ops.
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

_PROG = "kerasdist-run"
# Hydra tags each chunk it relays (and each line inside it) with this pattern,
# so a line written in pieces gets tags mid-line: we tag with control
# characters and re-assemble the lines ourselves.
_HYDRA_PATTERN = "\x1ekd:%r\x1f"
_MARKERS = {  # flavor -> (regex with the rank as group 1, its first byte)
    "mpich": (re.compile(rb"\x1ekd:(\d+)\x1f"), b"\x1e"),
    "openmpi": (re.compile(rb"\[\d+,(\d+)\]<std(?:out|err)>: ?"), b"["),
}
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
    for entry in args.hosts.split(",") if args.hosts is not None else ():
        name, sep, slots = entry.partition(":")
        if not name or (sep and not (slots.isdigit() and int(slots) > 0)):
            raise ValueError(
                "Invalid value for argument `-H`. Expected comma-separated "
                "`host` or `host:slots` entries, e.g. `host1:2,host2:2`. "
                f"Received: -H={args.hosts}")
    if args.hostfile is not None and not os.path.isfile(args.hostfile):
        raise ValueError("Invalid value for argument `--hostfile`. Expected an "
                         f"existing file. Received: --hostfile={args.hostfile}")
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


def build_env(args, base_env):
    """Builds the environment of the `mpiexec` process.

    Args:
        args: Namespace returned by `parse_args`.
        base_env: Mapping to start from (e.g. `os.environ`); not modified.

    Returns:
        A new dict: `base_env` updated with the `KERASDIST_*` settings.
    """
    return {**base_env, **settings_env(args)}


def build_mpiexec_argv(args, mpiexec_path, flavor="mpich"):
    """Builds the `mpiexec` command line (an argv list: no shell involved).

    Args:
        args: Namespace returned by `parse_args`.
        mpiexec_path: Path of the `mpiexec` executable.
        flavor: `"mpich"` (Hydra) or `"openmpi"`.

    Returns:
        The argv list, ending with the user's command verbatim. Settings are
        forwarded explicitly (`-genv`/`-x`) so that remote ranks get them.

    Raises:
        ValueError: If `flavor` is unknown.
    """
    env = settings_env(args)
    if flavor == "mpich":
        argv = [mpiexec_path, "-n", str(args.np),
                "-prepend-pattern", _HYDRA_PATTERN]
        argv += ["-hosts", args.hosts] if args.hosts else []
        argv += ["-f", args.hostfile] if args.hostfile else []
        for name, value in env.items():
            argv += ["-genv", name, value]
    elif flavor == "openmpi":
        argv = [mpiexec_path, "--allow-run-as-root", "--oversubscribe",
                "--tag-output", "-np", str(args.np)]
        argv += ["-H", args.hosts] if args.hosts else []
        argv += ["--hostfile", args.hostfile] if args.hostfile else []
        for name in env:
            argv += ["-x", name]
    else:
        raise ValueError("Invalid value for argument `flavor`. Expected "
                         f"'mpich' or 'openmpi'. Received: flavor={flavor}")
    return argv + list(args.command)


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


class _Demux:
    """Re-assembles lines from a rank-tagged stream, calling `emit(rank, line)`.

    `rank` is None for mpiexec's own output. Unterminated lines are emitted
    at the end of the stream.
    """

    def __init__(self, flavor, emit):
        self._marker, self._start = _MARKERS[flavor]
        self._emit, self._pending, self._rank, self._partial = emit, b"", None, {}

    def feed(self, data, final=False):
        buf, self._pending = self._pending + data, b""
        cut = buf.rfind(self._start)
        if (not final and cut != -1 and len(buf) - cut < 48
                and b"\n" not in buf[cut:] and not self._marker.match(buf, cut)):
            buf, self._pending = buf[:cut], buf[cut:]  # Maybe a split marker.
        pos = 0
        for match in self._marker.finditer(buf):
            self._add(buf[pos:match.start()])
            self._rank, pos = int(match.group(1)), match.end()
        self._add(buf[pos:])
        if final:
            for rank in sorted(self._partial, key=lambda r: (r is None, r or 0)):
                self._emit(rank, self._partial[rank])
            self._partial.clear()

    def _add(self, seg):
        while seg:
            nl = seg.find(b"\n") + 1
            cr = seg.find(b"\r") + 1
            if cr and (not nl or cr < nl - 1):
                # A carriage return (not of "\r\n"): an in-place update such
                # as a progress bar. The rank keeps writing the same line.
                self._emit(self._rank, self._partial.pop(self._rank, b"") + seg[:cr])
                seg = seg[cr:]
                continue
            if not nl:
                self._partial[self._rank] = self._partial.get(self._rank, b"") + seg
                return
            self._emit(self._rank, self._partial.pop(self._rank, b"") + seg[:nl])
            # Every line of a chunk is tagged: untagged bytes after a newline
            # come from mpiexec itself.
            seg, self._rank = seg[nl:], None


_NOBODY = object()  # no rank's line is being redrawn in place


class _Sink:
    """Writes lines to a console stream (rank-prefixed) and per-rank files."""

    def __init__(self, stream, name, output_dir, num_proc):
        self._stream, self._files = stream, {}
        try:  # on a terminal, in-place updates ("\r") are redrawn live
            self._live = bool(stream is not None and stream.isatty())
        except (AttributeError, ValueError):
            self._live = False
        self._held, self._inplace = {}, _NOBODY
        for rank in range(num_proc if output_dir else 0):
            os.makedirs(os.path.join(output_dir, f"rank.{rank}"), exist_ok=True)
            self._files[rank] = open(
                os.path.join(output_dir, f"rank.{rank}", name), "wb")

    def __call__(self, rank, line):
        if rank in self._files:
            self._files[rank].write(line)
            self._files[rank].flush()
        prefix = b"" if rank is None else b"[%d] " % rank
        if line.endswith(b"\r"):  # an in-place update (see _Demux)
            if not self._live:  # a file or pipe: show the line once it ends
                self._held[rank] = self._held.get(rank, b"") + line
                return
            shown = line.rstrip(b"\r\b")
            if not shown:
                return
            # Redraw this rank's line in place (a new row if another rank's
            # update was showing), then clear what is left of the old one.
            sep = b"\n" if self._inplace not in (_NOBODY, rank) else b""
            self._inplace = rank
            return self._write(sep + b"\r" + prefix + shown + b"\x1b[K")
        if self._live:
            sep = {_NOBODY: b"", rank: b"\r"}.get(self._inplace, b"\n")
            self._inplace = _NOBODY
        else:
            sep, line = b"", self._held.pop(rank, b"") + line
        text = line[:-1] if line.endswith(b"\n") else line
        self._write(sep + prefix + text + (b"\x1b[K\n" if sep == b"\r" else b"\n"))

    def _write(self, text):
        try:
            if self._stream is None:
                return
            if hasattr(self._stream, "buffer"):
                self._stream.buffer.write(text)
                self._stream.buffer.flush()
            else:
                self._stream.write(text.decode(errors="replace"))
                self._stream.flush()
        except (OSError, ValueError):  # E.g. `| head` closed our stdout.
            self._stream = None

    def pump(self, pipe, flavor):
        demux = _Demux(flavor, self)
        for data in iter(lambda: os.read(pipe.fileno(), 65536), b""):
            demux.feed(data)
        demux.feed(b"", final=True)
        for f in self._files.values():
            f.close()


def _terminal_group(fd=0):
    """Returns the terminal's foreground process group if `fd` is a tty."""
    try:
        return os.tcgetpgrp(fd) if os.isatty(fd) else None
    except OSError:
        return None


def launch(args):
    """Runs `args.command` on `args.np` ranks, relaying their output.

    Args:
        args: Namespace returned by `parse_args`.

    Returns:
        mpiexec's exit status (non-zero if a rank failed), or 128 + N if it
        was killed by signal N.

    Raises:
        FileNotFoundError: If there is no `mpiexec`.
    """
    mpiexec = find_mpiexec()
    flavor = detect_flavor(mpiexec)
    argv = build_mpiexec_argv(args, mpiexec, flavor)
    if args.verbose:
        for name, value in settings_env(args).items():
            print(f"{_PROG}: {name}={value}", file=sys.stderr)
        shown = shlex.join(argv).replace("\x1e", r"\x1e").replace("\x1f", r"\x1f")
        print(f"{_PROG}: running: {shown}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    sinks = [_Sink(sys.stdout, "stdout", args.output_filename, args.np),
             _Sink(sys.stderr, "stderr", args.output_filename, args.np)]
    # Hydra relays a terminal stdin only from the foreground process group.
    # Otherwise give mpiexec its own group so that each signal reaches it
    # once, through us: Hydra turns a second SIGINT into a forced abort.
    own_group = {}
    if _terminal_group() is None:
        own_group = ({"process_group": 0} if sys.version_info >= (3, 11)
                     else {"preexec_fn": os.setpgrp})
    procs, early = [], []  # Signals arriving before Popen returns are queued.

    def forward(signum, frame):
        if signum == signal.SIGINT and _terminal_group() == os.getpgrp():
            return  # The terminal delivered this Ctrl-C to mpiexec too.
        if not procs:
            early.append(signum)
            return
        try:
            procs[0].send_signal(signum)
        except OSError:  # mpiexec already exited.
            pass

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, forward)
    try:
        proc = subprocess.Popen(argv, env=build_env(args, os.environ),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                **own_group)
        procs.append(proc)
        for signum in early:
            forward(signum, None)
        threads = [threading.Thread(target=sink.pump, args=(pipe, flavor),
                                    daemon=True)
                   for sink, pipe in zip(sinks, (proc.stdout, proc.stderr))]
        for t in threads:
            t.start()
        code = proc.wait()
        for t in threads:  # Bounded: a stray proxy might keep a pipe open.
            t.join(timeout=10)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code


def check_build():
    """Prints how kerasdist was built; returns 0, or 1 if its ops don't load."""
    try:
        import kerasdist  # Lazy: imports TensorFlow and loads the ops.

        info = kerasdist.build_info()
        if not info.get("ops") or not info.get("library_path"):
            raise RuntimeError(f"build_info() reports no op library: {info}")
    except Exception as e:  # Whatever the failure, the build is unusable.
        print(f"{_PROG}: error: The kerasdist op library is not loadable. "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    try:
        import mpi4py

        if "mpi4py.MPI" not in sys.modules:  # No need to initialize MPI.
            mpi4py.rc.initialize = mpi4py.rc.finalize = False
        from mpi4py import MPI

        mpi4py_mpi = MPI.Get_library_version().strip().splitlines()[0]
    except Exception as e:
        mpi4py_mpi = f"unavailable ({type(e).__name__}: {e})"
    tf_built = info.get("tf_built_against")
    print(f"kerasdist {info.get('kerasdist_version')}\n"
          f"  TensorFlow:              {info.get('tf_version')} "
          f"(built against {tf_built})\n"
          f"  MPI library (kerasdist): {info.get('mpi_library')}\n"
          f"  MPI library (mpi4py):    {mpi4py_mpi}\n"
          f"  Op library:              {info.get('library_path')}\n"
          f"  Ops:                     {', '.join(info['ops'])}")
    if tf_built != info.get("tf_version"):
        print(f"{_PROG}: warning: kerasdist was built against TensorFlow "
              f"{tf_built} but TensorFlow {info.get('tf_version')} is running.",
              file=sys.stderr)
    return 0


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
    except OSError as e:  # No mpiexec, unwritable --output-filename, ...
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 1


if __name__ == "__main__":
    if not __package__:  # `python kerasdist/runner.py`: import the package
        here = os.path.dirname(os.path.abspath(__file__))  # not its modules.
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        sys.path.insert(0, os.path.dirname(here))
    sys.exit(main())
