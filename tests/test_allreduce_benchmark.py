"""Smoke test of benchmarks/allreduce.py in its --quick mode.

Every kerasdist path of the benchmark (eager, `tf.function`, grouped) is
checked once per size against the exact sum, and the benchmark exits 1 if
one is wrong; this runs it at np=2 under a hard timeout and checks the JSON
it writes. No timing thresholds: the machines are shared and noisy.
"""

import json
import math
import os

from conftest import run_mpi

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "benchmarks", "allreduce.py")


def test_quick_run_checks_sums_and_writes_every_row(tmp_path):
    out = tmp_path / "allreduce.json"
    result = run_mpi(BENCH, 2, timeout=300,
                     args=["--quick", "--sizes", "4K", "1M", "--json", str(out)])
    assert "kd tf.function 100x4 KiB" in result.stdout, result.stdout[-4000:]
    doc = json.loads(out.read_text())
    assert [row["bytes"] for row in doc["sizes"]] == [4096, 1 << 20]
    for row in doc["sizes"]:
        for key in ("kd_eager_s", "kd_fn_s", "mpich_s", "memcpy_s"):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
    grouped = doc["grouped_step_s"]
    assert {"tf.function split+concat only", "tf.function identity only",
            "MPICH 100x4 KiB"} <= set(grouped), grouped
    share = doc["grouped_collective_share"]
    # Differences of noisy times: finite, of either sign in a quick run.
    assert math.isfinite(share["many_s"]) and math.isfinite(share["one_s"]), share
    assert doc["machine"]["ranks"] == 2
    floors = doc["floors_4k_s"]  # 4 KiB is among the sizes
    assert set(floors) == {"tf eager identity", "tf.function loop iteration (multiply)",
                           "kd tf.function 1 per iteration"}, floors
    assert all(math.isfinite(v) and v > 0 for v in floors.values()), floors
    assert doc["chain_per_iteration"] >= 1
