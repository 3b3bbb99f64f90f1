"""Smoke test of benchmarks/torch_ddp.py in its --quick mode: one mpiexec
job with kerasdist.torch, gloo and MPICH side by side (kerasdist's sum is
checked exactly), one model under each configuration, and the JSON, table
and plot it writes. No timing thresholds: the machines are shared."""

import json
import math
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "benchmarks", "torch_ddp.py")


def test_quick_run_writes_every_method_and_config(tmp_path):
    out, png = tmp_path / "torch.json", tmp_path / "torch.png"
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--json", str(out), "--png",
                           str(png)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "| 4 KiB |" in proc.stdout and "| mnist |" in proc.stdout, proc.stdout
    doc = json.loads(out.read_text())
    assert [r["bytes"] for r in doc["collectives"]] == [4096, 65536]
    for row in doc["collectives"]:
        for method in ("kerasdist", "gloo", "MPICH", "memcpy"):
            t = row["seconds"][method]
            assert math.isfinite(t) and t > 0, (method, row)
    (model,) = doc["models"]
    assert model["model"] == "mnist"
    for config in ("kd", "ddp", "plain"):
        assert model[config] > 0, model
    assert png.stat().st_size > 0
