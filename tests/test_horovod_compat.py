"""A Horovod-style Keras script runs under kerasdist-run -np 2 unchanged but
for its import line (and the edits Keras 3 forces on every script)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_horovod_style_script_runs_under_kerasdist_run(tmp_path):
    runner = os.path.join(os.path.dirname(sys.executable), "kerasdist-run")
    cmd = [runner, "-np", "2", sys.executable,
           os.path.join(HERE, "horovod_compat", "horovod_style_keras_mnist.py")]
    # The shim first; the kerasdist under test stays importable as before.
    path = [os.path.join(HERE, "horovod_compat"), os.environ.get("PYTHONPATH")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p),
               COMPAT_EPOCHS="2", COMPAT_STEPS="40", KERASDIST_COMPAT_MNIST_LIMIT="6000",
               TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    assert "horovod-style script finished" in text and "restored Adam" in text, text[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1.keras", "checkpoint-2.keras"]
