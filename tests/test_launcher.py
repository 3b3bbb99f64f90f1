"""Tests for the `kerasdist-run` launcher (kerasdist/runner/cli.py).

The launcher is imported as `kerasdist.runner` and run as
`python -m kerasdist.runner`; it imports only the standard library and its
own modules (no TensorFlow, no op library), except in `test_check_build`,
which exercises the real build.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

from kerasdist.runner import cli as runner
from kerasdist.runner import relay

HERE = pathlib.Path(__file__).resolve().parent
RUNNER = [sys.executable, "-m", "kerasdist.runner"]
ECHO = HERE / "scripts" / "launcher_echo.py"

MPIEXEC = "/opt/mpi/bin/mpiexec"
TRICKY = ["a b; echo pwned", "it's \"quoted\"", "$HOME", "*", "", "x\ny"]


def argv_of(*cli, flavor="mpich"):
    args = runner.parse_args([str(a) for a in cli])
    return runner.build_mpiexec_argv(args, MPIEXEC, flavor)


def has_seq(items, seq):
    return any(items[i:i + len(seq)] == seq for i in range(len(items)))


def run(*cli, timeout=60, cwd=None):
    return subprocess.run([*RUNNER, *map(str, cli)],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def by_rank(text):
    """Maps rank -> lines without prefix; asserts every line is prefixed."""
    lines = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\[(\d+)\] (.*)", line)
        assert match, f"Line without rank prefix: {line!r}"
        lines.setdefault(int(match.group(1)), []).append(match.group(2))
    return lines


# Unit tests: command-line parsing, argv and environment building.


def test_basic_argv():
    assert argv_of("-np", 2, "python", "train.py", "--epochs", 3) == [
        MPIEXEC, "-n", "2", "-prepend-pattern", runner._HYDRA_PATTERN,
        "python", "train.py", "--epochs", "3"]
    args = runner.parse_args(["-np", "2", "prog", "x"])
    assert runner.build_mpiexec_argv(args, MPIEXEC, token="ab12",
                                     supervise=True) == [
        MPIEXEC, "-n", "2", "-prepend-pattern", "\x1ekdab12:%r\x1f",
        sys.executable, runner._SUPERVISOR, "--", "prog", "x"]


def test_options_after_command_belong_to_command():
    args = runner.parse_args(["-np", "2", "--", "python", "t.py", "-np", "5",
                              "-H", "x", "--verbose"])
    assert args.command == ["python", "t.py", "-np", "5", "-H", "x",
                            "--verbose"]
    assert args.np == 2 and not args.verbose and args.hosts is None


def test_user_args_are_passed_verbatim():
    argv = argv_of("-np", 2, "python", "t.py", *TRICKY)
    assert argv[-len(TRICKY) - 2:] == ["python", "t.py", *TRICKY]


def test_hosts_and_hostfile(tmp_path):
    assert has_seq(argv_of("-np", 4, "-H", "host1:2,host2:2", "prog"),
                   ["-hosts", "host1:2,host2:2"])
    hostfile = tmp_path / "hosts"
    hostfile.write_text("host1:2\nhost2:2\n")
    # The hostfile is read here, so that hosts and ranks keep their order.
    assert has_seq(argv_of("-np", 4, "--hostfile", hostfile, "prog"),
                   ["-hosts", "host1:2,host2:2"])
    with pytest.raises(ValueError, match="not allowed with"):
        argv_of("-np", 4, "-H", "a", "--hostfile", hostfile, "prog")
    with pytest.raises(ValueError, match="Expected an existing file"):
        argv_of("-np", 4, "--hostfile", tmp_path / "missing", "prog")


@pytest.mark.parametrize("hosts", ["host1:0", "host1:x", "a,,b", "", ":2"])
def test_invalid_hosts(hosts):
    with pytest.raises(ValueError, match="Invalid value for argument `-H`"):
        argv_of("-np", 2, "-H", hosts, "prog")


@pytest.mark.parametrize("value", ["0", "-1", "abc", "2.5"])
def test_invalid_np(value):
    with pytest.raises(ValueError) as info:
        argv_of("-np", value, "prog")
    assert str(info.value) == ("Invalid value for argument `-np`. Expected a "
                               f"positive integer. Received: -np={value}")


@pytest.mark.parametrize("flag,value,expected", [
    ("--cycle-time-ms", "0", "a positive number"),
    ("--cycle-time-ms", "nan", "a positive number"),
    ("--fusion-threshold-mb", "-1", "a non-negative number"),
    ("--stall-check-warning-time-seconds", "1.5", "a non-negative integer"),
    ("--stall-check-shutdown-time-seconds", "-3", "a non-negative integer"),
])
def test_invalid_settings(flag, value, expected):
    with pytest.raises(ValueError) as info:
        argv_of("-np", 2, flag, value, "prog")
    assert str(info.value) == (f"Invalid value for argument `{flag}`. "
                               f"Expected {expected}. Received: {flag}={value}")


def test_missing_np_or_command():
    with pytest.raises(ValueError, match="Missing required argument `-np`"):
        argv_of("prog")
    with pytest.raises(ValueError, match="Missing command to run"):
        argv_of("-np", 2)


def test_env_settings_and_forwarding():
    cli = ["-np", "2", "--timeline-filename", "/tmp/tl dir/t.json",
           "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
           "--stall-check-warning-time-seconds", "30",
           "--stall-check-shutdown-time-seconds", "90", "prog"]
    args = runner.parse_args(cli)
    base = {"PATH": "/bin", "KERASDIST_CYCLE_TIME": "99", "OTHER": "x"}
    env = runner.build_env(args, base)
    expected = {"KERASDIST_TIMELINE": "/tmp/tl dir/t.json",
                "KERASDIST_FUSION_THRESHOLD": str(32 * 1024 * 1024),
                "KERASDIST_CYCLE_TIME": "2.5",
                "KERASDIST_STALL_CHECK_TIME_SECONDS": "30",
                "KERASDIST_STALL_SHUTDOWN_TIME_SECONDS": "90"}
    assert env == {"PATH": "/bin", "OTHER": "x", **expected}
    assert base["KERASDIST_CYCLE_TIME"] == "99"  # Not modified.
    argv = runner.build_mpiexec_argv(args, MPIEXEC)
    for name, value in expected.items():  # Explicit, for remote hosts.
        assert has_seq(argv, ["-genv", name, value])
    assert argv[-1] == "prog"


def test_env_number_formats():
    args = runner.parse_args(["-np", "1", "--fusion-threshold-mb", "0.5",
                              "--cycle-time-ms", "5", "prog"])
    assert runner.settings_env(args) == {
        "KERASDIST_FUSION_THRESHOLD": "524288", "KERASDIST_CYCLE_TIME": "5"}
    args = runner.parse_args(["-np", "1", "prog"])
    assert runner.build_env(args, {"A": "1"}) == {"A": "1"}
    assert "-genv" not in runner.build_mpiexec_argv(args, MPIEXEC)


def test_openmpi_argv():
    argv = argv_of("-np", 4, "-H", "h1:2,h2:2", "--cycle-time-ms", 3,
                   "python", "t.py", *TRICKY, flavor="openmpi")
    assert argv[:6] == [MPIEXEC, "--allow-run-as-root", "--oversubscribe",
                        "--tag-output", "-np", "4"]
    assert has_seq(argv, ["-H", "h1:2,h2:2"])
    assert has_seq(argv, ["-x", "KERASDIST_CYCLE_TIME"])
    assert argv[-len(TRICKY) - 2:] == ["python", "t.py", *TRICKY]
    with pytest.raises(ValueError, match="Invalid value for argument `flavor`"):
        argv_of("-np", 1, "prog", flavor="lam")


def test_find_mpiexec(tmp_path, monkeypatch):
    env_bin, path_bin = tmp_path / "env" / "bin", tmp_path / "path"
    for directory in (env_bin, path_bin):
        directory.mkdir(parents=True)
        (directory / "mpiexec").write_text("#!/bin/sh\n")
        (directory / "mpiexec").chmod(0o755)
    monkeypatch.setenv("PATH", str(path_bin))
    monkeypatch.setattr(sys, "executable", str(env_bin / "python"))
    assert runner.find_mpiexec() == str(env_bin / "mpiexec")
    (env_bin / "mpiexec").unlink()
    assert runner.find_mpiexec() == str(path_bin / "mpiexec")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="Could not find `mpiexec`"):
        runner.find_mpiexec()


def _demux(flavor, data, step):
    out = []
    demux = relay._Demux(flavor, lambda rank, line: out.append((rank, line)))
    for i in range(0, len(data), step):
        demux.feed(data[i:i + step])
    demux.feed(b"", final=True)
    return out


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_demux_reassembles_split_lines(step):
    m0, m1 = b"\x1ekd:0\x1f", b"\x1ekd:1\x1f"
    data = (m0 + b"a1\n" + m0 + b"a2\n" + m1 + b"x" + m0 + b"b1\n"
            + b"[mpiexec@vm] note\n" + m1 + b"y\n" + m0 + b"\n" + m1 + b"tail")
    assert _demux("mpich", data, step) == [
        (0, b"a1\n"), (0, b"a2\n"), (0, b"b1\n"), (None, b"[mpiexec@vm] note\n"),
        (1, b"xy\n"), (0, b"\n"), (1, b"tail")]


def test_demux_openmpi_tags():
    data = b"[1,0]<stdout>: hi\n[1,1]<stdout>: [x] there\n"
    assert _demux("openmpi", data, 3) == [(0, b"hi\n"), (1, b"[x] there\n")]


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_demux_openmpi_tags_only_at_line_starts(step):
    # Rank 1 prints rank 0's tag at the start of its text and mid-line.
    data = (b"[1,1]<stdout>: [1,0]<stdout>: fake\n"
            b"[1,1]<stdout>: a [1,0]<stdout>: b\n[1,0]<stdout>: real\n")
    assert _demux("openmpi", data, step) == [
        (1, b"[1,0]<stdout>: fake\n"), (1, b"a [1,0]<stdout>: b\n"),
        (0, b"real\n")]


def _hydra_demux(token, data, step):
    out = []
    demux = relay._Demux("mpich", lambda r, line: out.append((r, line)), token)
    for i in range(0, len(data), step):
        demux.feed(data[i:i + step])
    demux.feed(b"", final=True)
    return out


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_demux_ignores_printed_tags(step):
    tag = lambda r, t=b"f00d": b"\x1ekd" + t + b":%d\x1f" % r  # noqa: E731
    # Rank 1 prints rank 0's tag with this run's token right after its own
    # tag, and tags of another run (other token, none) mid-line.
    data = (tag(1) + tag(0) + b"fake\n" + tag(1) + b"x " + tag(0, b"") + b"y "
            + tag(0, b"beef") + b"z\n" + tag(0) + b"real\n")
    assert _hydra_demux("f00d", data, step) == [
        (1, tag(0) + b"fake\n"),
        (1, b"x " + tag(0, b"") + b"y " + tag(0, b"beef") + b"z\n"),
        (0, b"real\n")]
    # Hydra's own mid-line tags (a line written in pieces) still count.
    data = tag(1) + b"half " + tag(0) + b"zero\n" + tag(1) + b"done\n"
    assert _hydra_demux("f00d", data, step) == [(0, b"zero\n"),
                                                 (1, b"half done\n")]


def test_main_reports_invalid_arguments(capsys):
    assert runner.main(["-np", "0", "python"]) == 2
    assert ("Invalid value for argument `-np`. Expected a positive integer. "
            "Received: -np=0") in capsys.readouterr().err


def test_runner_does_not_import_tensorflow():
    code = ("import runpy, sys; sys.argv = ['x', '--help']\n"
            "try: runpy.run_module('kerasdist.runner', run_name='__main__')\n"
            "except SystemExit: pass\n"
            "print('TF' if 'tensorflow' in sys.modules else 'noTF')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60)
    assert "usage: kerasdist-run" in out.stdout
    assert out.stdout.strip().endswith("noTF")


# End-to-end tests: real mpiexec, tests/scripts/launcher_echo.py on 2 ranks.


def test_e2e_prefix_env_and_verbatim_args(tmp_path):
    user_args = [*TRICKY, "--split-line"]
    out = run("-np", 2, "--timeline-filename", tmp_path / "tl dir" / "t.json",
              "--fusion-threshold-mb", 32, "--cycle-time-ms", 2.5,
              "--stall-check-warning-time-seconds", 30,
              "--stall-check-shutdown-time-seconds", 90,
              sys.executable, ECHO, *user_args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    expected_env = {"KERASDIST_TIMELINE": str(tmp_path / "tl dir" / "t.json"),
                    "KERASDIST_FUSION_THRESHOLD": str(32 * 1024 * 1024),
                    "KERASDIST_CYCLE_TIME": "2.5",
                    "KERASDIST_STALL_CHECK_TIME_SECONDS": "30",
                    "KERASDIST_STALL_SHUTDOWN_TIME_SECONDS": "90"}
    stdout, stderr = by_rank(out.stdout), by_rank(out.stderr)
    assert sorted(stdout) == sorted(stderr) == [0, 1]
    for rank, lines in stdout.items():
        assert f"rank={rank}" in lines
        assert "argv=" + json.dumps(user_args) in lines
        assert "env=" + json.dumps(expected_env, sort_keys=True) in lines
        assert f"first half of rank {rank} + second half" in lines
        assert stderr[rank] == [f"stderr line from rank {rank}"]
    assert "pwned" not in [line.strip() for line in out.stdout.splitlines()]


def test_e2e_ranks_form_one_mpi_job():
    out = run("-np", 2, sys.executable, ECHO, "--mpi")
    assert out.returncode == 0, out.stderr
    for rank, lines in by_rank(out.stdout).items():
        assert f"mpi_size=2 mpi_rank={rank}" in lines


def test_e2e_failing_rank_fails_the_launcher():
    out = run("-np", 2, sys.executable, ECHO, "--exit-rank=1", "--exit-code=3")
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr)


def test_e2e_output_filename(tmp_path):
    out = run("-np", 2, "--output-filename", tmp_path / "logs", sys.executable,
              ECHO, "hello")
    assert out.returncode == 0, out.stderr
    for rank in (0, 1):
        rank_dir = tmp_path / "logs" / f"rank.{rank}"
        lines = (rank_dir / "stdout").read_text().splitlines()
        assert lines[:2] == [f"rank={rank}", 'argv=["hello"]']
        assert (rank_dir / "stderr").read_text() == (
            f"stderr line from rank {rank}\n")
        assert f"rank={rank}" in by_rank(out.stdout)[rank]  # Still printed.


def test_e2e_verbose():
    out = run("-np", 2, "--verbose", "--cycle-time-ms", 3, sys.executable,
              ECHO)
    assert out.returncode == 0, out.stderr
    assert "kerasdist-run: KERASDIST_CYCLE_TIME=3" in out.stderr
    assert re.search(r"running: \S*mpiexec -n 2 .*-genv KERASDIST_CYCLE_TIME 3 "
                     + re.escape(sys.executable), out.stderr)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_e2e_forwards_signals(signum):
    proc = subprocess.Popen([*RUNNER, "-np", "2",
                             sys.executable, str(ECHO), "--wait-signal"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout),
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while sum("ready" in line for line in list(lines)) < 2:
            assert time.monotonic() < deadline, lines
            assert proc.poll() is None, lines
            time.sleep(0.05)
        # `lines` is filled line by line only once the pipe has data; both
        # ranks are now blocked in time.sleep() with handlers installed.
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 7, (proc.stderr.read(), lines)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    for rank in (0, 1):
        assert f"[{rank}] rank {rank} got signal {int(signum)}\n" in lines


def test_e2e_missing_command_file():
    out = run("-np", 2, "/nonexistent/program")
    assert out.returncode != 0


def _fake_kerasdist(monkeypatch, build_info):
    fake = types.ModuleType("kerasdist")
    fake.build_info = build_info
    monkeypatch.setitem(sys.modules, "kerasdist", fake)
    # Keep MPI (and mpi4py.rc) of this pytest process untouched.
    monkeypatch.setitem(sys.modules, "mpi4py", None)


def test_check_build_output_format(monkeypatch, capsys):
    _fake_kerasdist(monkeypatch, lambda: {
        "kerasdist_version": "0.1.0", "tf_version": "2.21.0",
        "tf_built_against": "2.20.0", "library_path": "/x/_kerasdist_ops.so",
        "ops": ["KerasdistAllreduce", "KerasdistBroadcast"],
        "mpi_library": "MPICH 5.0.2"})
    assert runner.check_build() == 0
    out, err = capsys.readouterr()
    assert "kerasdist 0.1.0" in out and "/x/_kerasdist_ops.so" in out
    assert "2.21.0 (built against 2.20.0)" in out and "MPICH 5.0.2" in out
    assert "Ops:                     KerasdistAllreduce, KerasdistBroadcast" in out
    assert "MPI library (mpi4py):    unavailable (" in out
    assert "warning: kerasdist was built against TensorFlow 2.20.0" in err


def _raise():
    raise RuntimeError("undefined symbol: _ZN10tensorflow8OpKernel")


@pytest.mark.parametrize("build_info", [
    _raise, lambda: {"library_path": "/x.so", "ops": []}])
def test_check_build_failure(monkeypatch, capsys, build_info):
    _fake_kerasdist(monkeypatch, build_info)
    assert runner.check_build() == 1
    assert "The kerasdist op library is not loadable" in capsys.readouterr().err


# Needs the real build (kerasdist.build_info() and the compiled op library).


def test_check_build():
    out = run("--check-build", timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "TensorFlow:" in out.stdout and "MPI library (mpi4py):" in out.stdout
    ops = re.search(r"Ops:\s*(.*)", out.stdout).group(1)
    assert ops.strip(), out.stdout


def test_package_and_launcher_import_without_tensorflow():
    # kerasdist-run starts mpiexec without first importing TensorFlow; the
    # public names load on first use, callbacks included.
    code = ("import sys, kerasdist, kerasdist.runner\n"
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
            "from kerasdist.callbacks import MetricAverageCallback\n"
            "assert kerasdist.allreduce.__module__ == 'kerasdist.tensorflow.ops'\n"
            "assert 'callbacks' in dir(kerasdist) and 'init' in kerasdist.__all__\n"
            "try:\n    kerasdist.no_such_name\nexcept AttributeError as e:\n"
            "    print('OK', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK module 'kerasdist' has no attribute 'no_such_name'" in out.stdout


class _FakeConsole:
    def __init__(self, tty):
        self.buffer, self._tty = __import__("io").BytesIO(), tty

    def isatty(self):
        return self._tty

    def flush(self):
        pass


@pytest.mark.parametrize("tty", [True, False])
def test_progress_bar_updates_relay(tty):
    # Keras draws its bar as "\b...\r<text>"; rank 1 prints a line meanwhile.
    m0, m1 = b"\x1ekd:0\x1f", b"\x1ekd:1\x1f"
    data = (m0 + b"Epoch 1\n" + m0 + b"\r1/3 [=..]" + b"\b" * 10 + b"\r2/3 [==.]"
            + m1 + b"hello\n" + m0 + b"\b" * 10 + b"\r3/3 [===] - loss: 1\n")
    for step in (1, 7, 1000):
        console = _FakeConsole(tty)
        sink = relay._Sink(console, "stdout", None, 2)
        demux = relay._Demux("mpich", sink)
        for i in range(0, len(data), step):
            demux.feed(data[i:i + step])
        demux.feed(b"", final=True)
        out = console.buffer.getvalue()
        if tty:  # redrawn in place; the other rank's line gets its own row
            # (2/3 is complete only at its "\r", after rank 1's line.)
            assert out == (b"[0] Epoch 1\n\r[0] 1/3 [=..]\x1b[K\n[1] hello\n"
                           b"\r[0] 2/3 [==.]\x1b[K\r[0] 3/3 [===] - loss: 1\x1b[K\n"), (step, out)
        else:  # a pipe or file: the whole line once it ends, as before
            assert out.count(b"\n") == 3 and b"[1] hello\n" in out, (step, out)
            assert out.endswith(b"3/3 [===] - loss: 1\n") and b"\r2/3" in out, (step, out)
