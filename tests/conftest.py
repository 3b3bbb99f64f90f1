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


def run_mpi(script, np, timeout=120, env=None, args=(), check=True):
    """Runs tests/mp/<script> on `np` ranks with a hard timeout.

    The whole process group is killed on timeout, so a hang is a failure and
    never blocks the suite. Returns the CompletedProcess (text output).
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
    if check and proc.returncode != 0:
        pytest.fail(f"{script} on {np} ranks exited with {proc.returncode}. "
                    f"Output:\n{out[-8000:]}")
    return result


@pytest.fixture
def mpi():
    return run_mpi
