"""The framework-neutral runtime works where no framework can be imported,
and loads none itself where one could be.

tests/no_framework/sitecustomize.py makes TensorFlow, Keras, PyTorch and JAX
fail to import in every process started with that folder on PYTHONPATH:
the launcher, its supervisors and the ranks. tests/no_framework/
runtime_checks.py then checks init, the rank queries, process sets, object
collectives, barriers, build_info and a second init against real values.
"""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BLOCKER = os.path.join(HERE, "no_framework")
SCRIPT = os.path.join(BLOCKER, "runtime_checks.py")
BIN = os.path.dirname(sys.executable)


def _env(block=True):
    path = [ROOT] + ([BLOCKER] if block else [])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), TF_CPP_MIN_LOG_LEVEL="2")


def _run(cmd, env, timeout=180):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return out.returncode, out.stdout + out.stderr


def test_the_blocker_blocks():
    rc, text = _run([sys.executable, "-c", "import tensorflow"], _env())
    assert rc != 0 and "cannot be imported in this test" in text, text[-2000:]


def test_runtime_alone_without_frameworks():
    rc, text = _run([sys.executable, SCRIPT], _env())
    assert rc == 0, text[-4000:]
    assert "rank 0: no-framework runtime ok" in text


@pytest.mark.parametrize("np", [2, 3])
def test_runtime_under_mpiexec_without_frameworks(np):
    rc, text = _run([os.path.join(BIN, "mpiexec"), "-n", str(np), sys.executable, SCRIPT],
                    _env())
    assert rc == 0, text[-4000:]
    for r in range(np):
        assert f"rank {r}: no-framework runtime ok" in text, text[-4000:]


def test_launcher_and_runtime_without_frameworks():
    rc, text = _run([sys.executable, "-m", "kerasdist.runner", "-np", "2", sys.executable,
                     SCRIPT], _env())
    assert rc == 0, text[-4000:]
    assert "rank 0: no-framework runtime ok" in text and "rank 1: no-framework runtime ok" in text


def test_runtime_imports_no_framework_where_one_is_installed():
    code = ("import sys, kerasdist as kd; kd.init(); kd.allgather_object(kd.rank()); "
            "kd.broadcast_object(1); kd.barrier(); kd.build_info(); kd.shutdown(); "
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras', 'torch', 'jax')); print('loaded', loaded)")
    rc, text = _run([sys.executable, "-c", code], _env(block=False))
    assert rc == 0, text[-4000:]
    assert "loaded []" in text, text[-2000:]
