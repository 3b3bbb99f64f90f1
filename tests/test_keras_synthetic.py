"""Smoke test of benchmarks/keras_synthetic.py in its --quick mode.

It runs the whole benchmark (plain Keras np=1, kerasdist np=1 and np=2, two
plain-Keras processes side by side; real `fit` steps and real kerasdist
collectives) on two small models, under a
hard timeout that kills the process group, and checks the JSON it writes:
a positive, finite throughput for every configuration and a finite engine
CPU fraction at np=2. No timing thresholds: the machines are shared and
noisy.
"""

import json
import math
import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(ROOT, "benchmarks", "keras_synthetic.py")
CONFIGS = ("keras_np1_t2", "kd_np1_t2", "kd_np1_t1", "kd_np2_t1", "keras_2x_t1")
MODELS = ("mnist", "embedding")


def _finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v)


def test_quick_run_writes_positive_throughputs(tmp_path):
    out_json, out_png = tmp_path / "ks.json", tmp_path / "ks.png"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, SCRIPT, "--quick", "--models", *MODELS,
           "--json", str(out_json), "--png", str(out_png), "--run-timeout", "150"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=ROOT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"keras_synthetic.py --quick timed out. Output:\n{out[-6000:]}")
    assert proc.returncode == 0, f"exit {proc.returncode}. Output:\n{out[-8000:]}"

    doc = json.loads(out_json.read_text())
    assert out_png.stat().st_size > 0
    assert doc["config"]["quick"] is True and doc["failed"] == []
    for model in MODELS:
        for config in CONFIGS:
            rec = doc["results"][model][config]
            assert "error" not in rec, rec.get("error")
            assert _finite(rec["samples_per_s"]) and rec["samples_per_s"] > 0, (model, config)
            assert rec["global_batch"] == rec["batch_per_rank"] * rec["np"]
            assert len(rec["cpu_per_rank"]) == rec["np"]
        np2 = doc["results"][model]["kd_np2_t1"]
        # The engine thread was found on every rank and its share is finite.
        assert all(c["engine_threads"] == 1 for c in np2["cpu_per_rank"])
        frac = np2["engine_cpu_fraction"]
        assert _finite(frac) and 0.0 <= frac <= 1.0, frac
        assert "kd-engine" not in str(doc["results"][model]["keras_np1_t2"]["cpu_per_rank"])
        summary = doc["summary"][model]
        assert _finite(summary["kd_np2_over_keras"]) and summary["kd_np2_over_keras"] > 0
        assert _finite(summary["scaling_efficiency"]) and summary["scaling_efficiency"] > 0
        # Two plain-Keras processes side by side: independent, both counted.
        pair = doc["results"][model]["keras_2x_t1"]
        assert pair["independent"] and len(pair["cpu_per_rank"]) == 2
        assert "kd-engine" not in str(pair["cpu_per_rank"])
        assert _finite(summary["kd_np2_over_two_processes"])
        assert summary["kd_np2_over_two_processes"] > 0
        assert _finite(summary["two_processes_over_keras"])
        # They started their measured windows together (a file barrier).
        assert 0.0 <= pair["window_overlap"] <= 1.0
        assert pair["global_batch"] == 2 * pair["batch_per_rank"]
    # The embedding gradient reaches the optimizer as tf.IndexedSlices.
    grads = doc["results"]["embedding"]["kd_np2_t1"]["grad_types"]
    assert any("embedding" in k and v == "IndexedSlices" for k, v in grads.items()), grads
