"""`kerasdist.run()`: runs a Python function on several MPI ranks and returns
what each rank returned, e.g. from a notebook:

    import kerasdist as kd

    def train(epochs):
        import kerasdist as kd
        kd.init()
        ...
        return history.history["loss"][-1]

    losses = kd.run(train, args=(3,), np=2)  # [loss on rank 0, on rank 1]
"""

import collections
import math
import numbers
import os
import pickle
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from kerasdist.runner import cli as runner
from kerasdist.runner import relay
from kerasdist.runner.tracebacks import resolve as resolve_tracebacks

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "run_worker.py")
# Once a rank has failed, the others get this long to stop by themselves
# (a collective waiting for the failed rank errors out), then are stopped.
_ABORT_GRACE_SECONDS = 10.0
_TERM_GRACE_SECONDS = 3.0  # From SIGTERM to SIGKILL when stopping the job.
_DRAIN_SECONDS = 5.0  # Output still relayed once mpiexec has exited.
_POLL_SECONDS = 0.25
_TAIL_LINES = 20  # Last output lines per rank quoted in error messages.


def _ranks_text(ranks):
    ranks = [str(r) for r in sorted(ranks)]
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(ranks[:-1])} and {ranks[-1]}"


def _validate(fn, args, kwargs, np, hosts, env, timeout):
    """Checks `run()`'s arguments; returns `(args, kwargs, env)` normalized."""
    if not callable(fn):
        raise TypeError("Invalid value for argument `fn`. Expected a callable. "
                        f"Received: fn={fn!r} of type {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError("Invalid type for argument `args`. Expected a tuple or "
                        f"a list. Received: args={args!r}")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise TypeError("Invalid type for argument `kwargs`. Expected a dict "
                        f"or None. Received: kwargs={kwargs!r}")
    if isinstance(np, bool) or not isinstance(np, numbers.Integral):
        raise TypeError("Invalid type for argument `np`. Expected a positive "
                        f"integer. Received: np={np!r}")
    if np < 1:
        raise ValueError("Invalid value for argument `np`. Expected a positive "
                         f"integer. Received: np={np}")
    if hosts is not None and not isinstance(hosts, str):
        raise TypeError("Invalid type for argument `hosts`. Expected a string "
                        f"such as 'host1:2,host2:2', or None. Received: "
                        f"hosts={hosts!r}")
    if hosts is not None:
        try:
            runner.parse_args(["-np", "1", "-H", hosts, "--", "fn"])
        except ValueError:
            raise ValueError(
                "Invalid value for argument `hosts`. Expected comma-separated "
                "'host' or 'host:slots' entries, e.g. 'host1:2,host2:2'. "
                f"Received: hosts={hosts!r}") from None
    if env is None:
        env = {}
    if not isinstance(env, dict):
        raise TypeError("Invalid type for argument `env`. Expected a dict of "
                        f"str to str. Received: env={env!r}")
    for name, value in env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(
                "Invalid value for argument `env`. Expected a dict of str to "
                f"str. Received the entry {name!r}: {value!r} (of types "
                f"{type(name).__name__}, {type(value).__name__})")
        if not name or "=" in name or "\0" in name + value:
            raise ValueError(
                "Invalid value for argument `env`. Expected environment "
                "variable names that are non-empty and contain no '=' or NUL, "
                f"and values without NUL. Received the entry {name!r}: "
                f"{value!r}")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError("Invalid type for argument `timeout`. Expected a "
                            "number of seconds or None. Received: "
                            f"timeout={timeout!r}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError("Invalid value for argument `timeout`. Expected a "
                             "positive number of seconds or None. Received: "
                             f"timeout={timeout!r}")
    return tuple(args), dict(kwargs), dict(env)


def _env_flags(flavor, env):
    """`mpiexec` flags forwarding `env` to every rank, remote ones included."""
    flags = []
    for name, value in env.items():
        flags += (["-genv", name, value] if flavor == "mpich" else ["-x", name])
    return flags


class _Job:
    """A running `mpiexec`: relays its output, watches the result files, and
    stops it."""

    def __init__(self, argv, env, np, flavor, result_dir):
        self.np, self.result_dir = np, result_dir
        self.records = {}  # rank -> record written by the worker.
        self.pids = {}  # rank -> (pid, pgid) of ranks on this host.
        self.vanished = set()  # Ranks on this host gone without a record.
        self.tails = {}  # rank -> last output lines.
        self.mpiexec_lines = collections.deque(maxlen=_TAIL_LINES)
        self._quiet = False  # Once we stop the job, its banners are noise.
        self._host = socket.gethostname()
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
        self._selector, self._closed = selectors.DefaultSelector(), False
        for pipe, stream, name in ((self.proc.stdout, sys.stdout, "stdout"),
                                   (self.proc.stderr, sys.stderr, "stderr")):
            sink = relay._Sink(stream, name, None, np)
            demux = relay._Demux(flavor, self._emitter(sink))
            self._selector.register(pipe, selectors.EVENT_READ, demux)

    def _emitter(self, sink):
        def emit(rank, line):
            if rank is None:
                if self._quiet:
                    return
                self.mpiexec_lines.append(line)
            else:
                self.tails.setdefault(rank, collections.deque(
                    maxlen=_TAIL_LINES)).append(line)
            sink(rank, line)

        return emit

    def pump(self, seconds):
        """Relays output for at most `seconds` (less when some arrives)."""
        if not self._selector.get_map():  # Both pipes closed.
            try:
                self.proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                pass
            return
        for key, _ in self._selector.select(timeout=seconds):
            data = os.read(key.fd, 65536)
            if data:
                key.data.feed(data)
            else:
                self._selector.unregister(key.fileobj)
                key.fileobj.close()
                key.data.feed(b"", final=True)

    def pump_until(self, deadline):
        """Relays output until mpiexec has exited and its pipes are closed,
        or until `deadline` (a `time.monotonic()` value)."""
        while self._selector.get_map() or self.proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.pump(min(left, _POLL_SECONDS))

    def close(self):
        """Stops relaying; emits unterminated lines. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fileobj)
            key.fileobj.close()
            key.data.feed(b"", final=True)
        self._selector.close()

    def scan(self):
        """Reads new result and pid files; notes ranks on this host that
        vanished without a result."""
        for rank in range(self.np):
            if rank in self.records:
                continue
            if rank not in self.pids:
                info = self._load(f"pid.{rank}")
                if isinstance(info, tuple) and info[0] == self._host:
                    self.pids[rank] = info[1:]
            gone = rank in self.pids and not _alive(self.pids[rank][0])
            record = self._load(f"rank.{rank}")  # After the liveness check.
            if record is not None:
                self.records[rank] = record
                self.vanished.discard(rank)
            elif gone:
                self.vanished.add(rank)

    def _load(self, name):
        try:
            with open(os.path.join(self.result_dir, name), "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return None
        except Exception as e:  # Truncated or corrupt: report, don't crash.
            return {"status": "error", "type": type(e).__qualname__,
                    "message": f"Could not read its result file {name}: {e}",
                    "traceback": ""}

    def failed_ranks(self):
        bad = {r for r, rec in self.records.items() if rec["status"] != "ok"}
        return bad | self.vanished

    def stop(self):
        """Stops mpiexec and the ranks: SIGTERM, then SIGKILL. Bounded."""
        self._quiet = True
        if self.proc.poll() is None:
            # mpiexec relays the signal to every rank, remote ones included.
            _kill_group(self.proc.pid, signal.SIGTERM)
            self.pump_until(time.monotonic() + _TERM_GRACE_SECONDS)
        # Ranks run in their own sessions (Hydra): kill those on this host.
        self.scan()
        for pid, pgid in self.pids.values():
            if pgid not in (self.proc.pid, os.getpgrp()):
                _kill_group(pgid, signal.SIGKILL)
        _kill_group(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=_TERM_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _kill_group(pgid, signum):
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _exit_text(code):
    if code is None:
        return "mpiexec did not exit and was killed"
    if code < 0:
        return f"mpiexec was killed by signal {-code}"
    return f"mpiexec exited with status {code}"


def _quote(lines, rank=None):
    prefix = "" if rank is None else f"[{rank}] "
    return "".join(f"  {prefix}{line.decode(errors='replace').rstrip()}\n"
                   for line in lines)


def _failure_message(job, np, errors, missing, aborted_after):
    failed = sorted(set(errors) | set(missing))
    parts = [f"kerasdist.run: {_ranks_text(failed)} of {np} failed."]
    # The first failure first: the others are often its consequences.
    for rank in sorted(errors, key=lambda r: (errors[r].get("time", math.inf), r)):
        rec = errors[rank]
        parts.append(f"Rank {rank} failed: {rec['type']}: {rec['message']}\n"
                     + rec["traceback"])
    stopped = [r for r in missing if aborted_after and r not in aborted_after]
    for rank in sorted(missing, key=lambda r: (r in stopped, r)):
        if rank in stopped:
            text = (f"Rank {rank} was stopped {_ABORT_GRACE_SECONDS:g} s after "
                    f"{_ranks_text(aborted_after)} failed, before returning.")
        elif aborted_after:  # mpiexec's exit status is then our doing.
            text = f"Rank {rank} exited without returning a result."
        else:
            text = (f"Rank {rank} exited without returning a result "
                    f"({_exit_text(job.proc.returncode)}).")
        if job.tails.get(rank):
            text += "\nIts last output lines:\n" + _quote(job.tails[rank], rank)
        parts.append(text)
    if job.mpiexec_lines and len(stopped) < len(missing):
        parts.append("mpiexec reported:\n" + _quote(job.mpiexec_lines))
    return "\n\n".join(p.rstrip() for p in parts)


def run(fn, args=(), kwargs=None, np=2, hosts=None, env=None, timeout=None,
        verbose=False):
    """Runs `fn(*args, **kwargs)` on `np` MPI ranks and returns their results.

    Like `horovod.run`: meant for notebooks, where there is no script to give
    `kerasdist-run`. `fn` and its arguments are serialized with cloudpickle,
    so a function defined in the notebook (or any closure) works. Each rank
    is a fresh Python process started by this environment's `mpiexec` (the
    one `kerasdist-run` uses), with the caller's working directory and
    `sys.path`. `fn` must call `kerasdist.init()` itself; kerasdist is shut
    down on each rank after `fn` returns.

    The ranks' output is relayed live, line by line and prefixed with the
    rank (`[0] ...`), to `sys.stdout` and `sys.stderr`, i.e. to the notebook.

    Example:

    ```python
    def train(lr):
        import kerasdist as kd
        kd.init()
        ...
        return model.evaluate(x_val, y_val, verbose=0)

    results = kerasdist.run(train, args=(0.01,), np=2)
    ```

    Args:
        fn: The function to run on every rank.
        args: Positional arguments for `fn`, a tuple or a list. Defaults to
            `()`.
        kwargs: Keyword arguments for `fn`, a dict. Defaults to `None`.
        np: Number of ranks. Defaults to `2`.
        hosts: Hosts to run on, e.g. `"host1:2,host2:2"`, or `None` for this
            host. The temporary directory (see `tempfile.gettempdir()`, set
            by `TMPDIR`) must then be shared by all the hosts, and the same
            Python installed at the same path. Defaults to `None`.
        env: Extra environment variables for the ranks, a dict of str to str,
            e.g. `{"KERASDIST_CYCLE_TIME": "5"}`. Defaults to `None`.
        timeout: Seconds the whole run may take, or `None` to wait for the
            ranks however long they take. Defaults to `None`.
        verbose: If True, print the `mpiexec` command line to `sys.stderr`.
            Defaults to `False`.

    Returns:
        The list of the values `fn` returned, ordered by rank.

    Raises:
        TypeError: If an argument has the wrong type, or `fn` and its
            arguments cannot be serialized.
        ValueError: If an argument has an invalid value.
        FileNotFoundError: If there is no `mpiexec`.
        RuntimeError: If a rank failed: `fn` raised (the message includes its
            traceback), the rank exited or was killed before returning, or
            its return value could not be sent back. Once a rank has failed
            the others have 10 seconds to finish, then are stopped.
        TimeoutError: If `timeout` expired; all the ranks are stopped.
    """
    start = time.monotonic()
    args, kwargs, env = _validate(fn, args, kwargs, np, hosts, env, timeout)
    import cloudpickle

    try:
        call = cloudpickle.dumps((fn, args, kwargs))
    except Exception as e:
        raise TypeError("kerasdist.run: could not serialize `fn` and its "
                        f"arguments with cloudpickle: {type(e).__name__}: "
                        f"{e}") from e
    mpiexec = runner.find_mpiexec()
    flavor = runner.detect_flavor(mpiexec)
    work_dir = tempfile.mkdtemp(prefix="kerasdist-run-")
    job = None
    try:
        payload = os.path.join(work_dir, "payload.pkl")
        with open(payload, "wb") as f:
            pickle.dump({"sys_path": list(sys.path), "call": call}, f)
        result_dir = os.path.join(work_dir, "results")
        os.mkdir(result_dir)
        command = [sys.executable, "-u", _WORKER, payload, result_dir]
        cli = ["-np", str(int(np))]
        cli += ["-H", hosts] if hosts is not None else []
        parsed = runner.parse_args(cli + ["--"] + command)
        argv = runner.build_mpiexec_argv(parsed, mpiexec, flavor)
        cut = len(argv) - len(command)
        argv[cut:cut] = _env_flags(flavor, env)
        if verbose:
            shown = shlex.join(argv).replace("\x1e", r"\x1e").replace(
                "\x1f", r"\x1f")
            print(f"kerasdist.run: running: {shown}", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        job = _Job(argv, {**runner.build_env(parsed, os.environ), **env},
                   np, flavor, result_dir)
        deadline = None if timeout is None else start + timeout
        abort_at = aborted_after = first_failed = None
        while job.proc.poll() is None:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                job.scan()
                running = [r for r in range(np) if r not in job.records]
                job.stop()
                job.close()
                if running:
                    were = "was" if len(running) == 1 else "were"
                    what = (f"{_ranks_text(running)} of {np} had not finished "
                            f"and {were} stopped")
                else:
                    what = ("all ranks had returned but mpiexec had not "
                            "exited; it was stopped")
                text = f"kerasdist.run: timed out after {timeout:g} s: {what}."
                errors = {r: rec for r, rec in job.records.items()
                          if rec["status"] != "ok"}
                if errors:  # What went wrong first matters more.
                    text += "\n\n" + _failure_message(job, np, resolve_tracebacks(
                        errors, fn), [], None)
                raise TimeoutError(text)
            if abort_at is not None and now >= abort_at:
                aborted_after = first_failed
                job.stop()
                break
            job.pump(_POLL_SECONDS if deadline is None
                     else min(_POLL_SECONDS, max(0.0, deadline - now)))
            job.scan()
            if abort_at is None and job.failed_ranks():
                first_failed = job.failed_ranks()
                abort_at = time.monotonic() + _ABORT_GRACE_SECONDS
        job.pump_until(time.monotonic() + _DRAIN_SECONDS)
        job.close()
        job.scan()

        errors, values = {}, {}
        for rank, rec in job.records.items():
            if rec["status"] != "ok":
                errors.update(resolve_tracebacks({rank: rec}, fn))
                continue
            try:
                values[rank] = cloudpickle.loads(rec["value"])
            except Exception as e:
                errors[rank] = {
                    "status": "error", "type": type(e).__qualname__,
                    "message": f"Its return value could not be unpickled "
                               f"here: {e}", "traceback": ""}
        missing = [r for r in range(np) if r not in job.records]
        if errors or missing:
            raise RuntimeError(_failure_message(job, np, errors, missing,
                                                aborted_after))
        if job.proc.returncode != 0:
            raise RuntimeError(
                f"kerasdist.run: all {np} ranks returned, but "
                f"{_exit_text(job.proc.returncode)}.\nmpiexec reported:\n"
                + _quote(job.mpiexec_lines))
        return [values[r] for r in range(np)]
    finally:
        if job is not None and job.proc.poll() is None:
            job.stop()  # E.g. KeyboardInterrupt: leave no rank behind.
        if job is not None:
            job.close()
        shutil.rmtree(work_dir, ignore_errors=True)
