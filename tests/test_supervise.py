"""Tests for the per-rank supervisor (kerasdist/runner/supervise.py) and for
`kerasdist-run` stopping the whole job when one rank fails."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
RUNNER = [sys.executable, "-m", "kerasdist.runner"]  # kerasdist-run
SUPERVISOR = HERE.parent / "kerasdist" / "runner" / "supervise.py"
SCRIPTS = HERE / "scripts"
REPORT = "kerasdist-run: rank 1 (host h1) exited with code 3; stopping the job."


def run_bounded(argv, timeout, env=None):
    """Runs `argv` in its own session; a hang (timeout) kills the session
    and fails the test."""
    proc = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env=None if env is None else {**os.environ, **env})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"{argv} hung for {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def gone(pid, timeout=10.0):
    """True once `pid` no longer runs (a zombie counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def supervise(*command, env=None, timeout=30):
    return run_bounded([sys.executable, SUPERVISOR, "--", *command], timeout,
                       env=env)


def test_success_passes_through():
    out = supervise("sh", "-c", "echo out; echo err >&2")
    assert (out.returncode, out.stdout, out.stderr) == (0, "out\n", "err\n")


def test_failure_is_reported_and_the_supervisor_dies_from_a_signal():
    out = supervise("sh", "-c", "echo bad config >&2; exit 3",
                    env={"PMI_RANK": "1", "PMI_HOSTNAME": "h1"})
    assert out.returncode == -signal.SIGKILL  # Hydra then stops the job.
    assert out.stderr == f"bad config\n{REPORT}\n"


def test_signal_death_is_reported_and_mirrored():
    out = supervise("sh", "-c", "kill -TERM $$", env={"PMI_RANK": "0"})
    assert out.returncode == -signal.SIGTERM
    assert out.stderr.startswith("kerasdist-run: rank 0 (host ")
    assert out.stderr.endswith(") was killed by signal 15 (SIGTERM); "
                               "stopping the job.\n")


def test_missing_command():
    out = supervise("/nonexistent/program", env={"PMI_RANK": "0"})
    assert out.returncode == -signal.SIGKILL
    assert "exited with code 127 (could not start '/nonexistent/program'" in (
        out.stderr)


def test_forwards_a_stop_signal_and_exits_with_the_childs_code():
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
            "print('ready', flush=True)\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, SUPERVISOR, "--", sys.executable,
                             "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        # Sent by another process than the supervisor's parent: forwarded.
        subprocess.run(["kill", "-TERM", str(proc.pid)], check=True, timeout=10)
        assert proc.wait(timeout=20) == 7
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_child_dies_with_the_supervisor(tmp_path):
    code = ("import os, sys, time\n"
            f"open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, SUPERVISOR, "--", sys.executable,
                             "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        child = int((tmp_path / "pid").read_text())
        proc.kill()
        proc.wait(timeout=10)
        assert gone(child), f"child {child} outlived its supervisor"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_rank_exiting_before_init_stops_the_job(tmp_path):
    # Rank 0 waits in kerasdist.init() (300 s by default); rank 1 exits
    # with status 3 first. The job must end at once, with rank 1's status.
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    out = run_bounded([*RUNNER, "-np", 2, sys.executable,
                       SCRIPTS / "exit_before_init.py", tmp_path], 90, env=env)
    ended = time.time()
    assert out.returncode == 3, (out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert "[1] bad config" in lines
    assert any(line.startswith("[1] kerasdist-run: rank 1 (host ") and
               line.endswith(") exited with code 3; stopping the job.")
               for line in lines), lines
    assert lines[-1].startswith("kerasdist-run: error: rank 1 (host ")
    assert "rank 0 passed init()" not in out.stdout
    assert "BAD TERMINATION" not in out.stdout + out.stderr  # Hydra's banner.
    # Hang bound only: without the supervisor rank 0 waits 300 s.
    assert ended - float((tmp_path / "exit_time").read_text()) < 15
    for pid in map(int, (tmp_path / "pids").read_text().split()):
        assert gone(pid), f"process {pid} of rank 0 was left behind"


def test_rank_killed_by_a_signal_is_reported():
    out = run_bounded([*RUNNER, "-np", 2, "sh", "-c",
                       'if [ "$PMI_RANK" = 1 ]; then kill -KILL $$; fi; sleep 60'],
                      60)
    assert out.returncode == 128 + signal.SIGKILL, (out.stdout, out.stderr)
    assert "was killed by signal 9 (SIGKILL); stopping the job." in out.stderr
