"""Keras layer under mpiexec -n 2: fit, custom loops, mixed precision,
saving/loading in a fresh process, rank-0 checkpointing with kills."""

import os
import subprocess
import sys

from conftest import run_mpi


def fresh_python(code, timeout=120):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_fit_custom_loop_accumulation_mixed_precision_and_load(tmp_path):
    path = tmp_path / "model.keras"
    run_mpi("keras_fit.py", 2, timeout=240, args=[path])
    # Plain Keras in a fresh process, without importing kerasdist.
    out = fresh_python(
        "import keras, sys\n"
        f"m = keras.models.load_model({str(path)!r})\n"
        "assert 'kerasdist' not in sys.modules\n"
        "print(type(m.optimizer).__name__, int(m.optimizer.iterations))\n")
    assert out.split() == ["Adam", "1"]
    out = fresh_python(
        "import kerasdist as kd\nkd.init()\n"
        f"m = kd.load_model({str(path)!r})\n"
        "from kerasdist._keras.optimizer import is_distributed\n"
        "print(is_distributed(m.optimizer), int(m.optimizer.iterations))\n")
    assert out.split() == ["True", "1"]


def test_model_checkpoint_rank0_only_and_kill_during_save(tmp_path):
    run_mpi("keras_checkpoint.py", 2, timeout=180, args=["ckpt", tmp_path])
    assert os.listdir(tmp_path) == ["model.keras"]
    first = os.path.getmtime(tmp_path / "model.keras")
    result = run_mpi("keras_checkpoint.py", 2, timeout=180,
                     args=["ckpt-kill", tmp_path], check=False)
    assert result.returncode != 0  # rank 0 was killed mid-save
    assert os.path.getmtime(tmp_path / "model.keras") >= first
    out = fresh_python("import keras\n"
                       f"m = keras.models.load_model({str(tmp_path / 'model.keras')!r})\n"
                       "print(len(m.weights))\n")
    assert out.strip() == "4"


def test_backup_and_restore_resumes_after_kill(tmp_path):
    result = run_mpi("keras_checkpoint.py", 2, timeout=180,
                     args=["backup-kill", tmp_path], check=False)
    assert result.returncode != 0 and "dying after epoch 2" in result.stdout
    assert os.path.exists(tmp_path / "state.npz")
    out = run_mpi("keras_checkpoint.py", 2, timeout=180, args=["backup-run", tmp_path]).stdout
    assert out.count("resumed at epoch 3 with identical weights") == 2
