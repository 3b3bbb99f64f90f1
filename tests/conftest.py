"""Shared fixtures: run a script under the environment's own mpiexec."""

import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MP_DIR = os.path.join(HERE, "mp")


def mpiexec_path():
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.path.exists(local) else "mpiexec"


# What kerasdist's exit guard prints when it ends a process whose engine
# failed earlier because exiting took longer than its bound.
EXIT_GUARD_LINE = "did not finish within 5 s; ending the process with exit code 1."


def exited_by_guard(returncode, out):
    """Whether a non-zero status is only the exit guard's: every rank ran to
    its end (no failure of the script's own), but exiting took over 5 s."""
    return (returncode == 1 and EXIT_GUARD_LINE in out and "] FAILED" not in out
            and "Traceback (most recent call last)" not in out)


def run_mpi(script, np, timeout=120, env=None, args=(), check=True, guarded_exit=False):
    """Runs tests/mp/<script> on `np` ranks with a hard timeout.

    The whole process group is killed on timeout, so a hang is a failure and
    never blocks the suite. Returns the CompletedProcess (text output).

    `guarded_exit`: the script makes the engine fail on purpose and then
    exits normally. Once an engine failed, kerasdist ends a process that
    takes more than 5 s to exit with status 1 (MPI_Finalize could wait on a
    lost peer), and interpreter teardown with TensorFlow loaded takes that
    long on a loaded machine, peers healthy or not. So status 1 with the
    guard's line, and no failure of the script's own, passes the check too.
    """
    full_env = dict(os.environ)
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    full_env["PYTHONUNBUFFERED"] = "1"
    full_env.update(env or {})
    cmd = [mpiexec_path(), "-n", str(np), sys.executable,
           os.path.join(MP_DIR, script), *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=full_env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: Hydra forwards it to the ranks (each rank runs in its
        # own session, so killing mpiexec's group alone would leave them).
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"{script} on {np} ranks timed out after {timeout} s "
                    f"(a hang). Output:\n{out[-6000:]}")
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, "")
    if check and proc.returncode != 0 and not (
            guarded_exit and exited_by_guard(proc.returncode, out)):
        pytest.fail(f"{script} on {np} ranks exited with {proc.returncode}. "
                    f"Output:\n{out[-8000:]}")
    return result


@pytest.fixture
def mpi():
    return run_mpi
