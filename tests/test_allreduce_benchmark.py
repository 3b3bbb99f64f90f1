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
        # The printed ratio is the tf.function's own, not the faster path's.
        assert math.isclose(row["bw_ratio_kd_fn_over_mpich"],
                            row["mpich_s"] / row["kd_fn_s"]), row
        assert row["bw_ratio_kd_best_over_mpich"] >= row["bw_ratio_kd_fn_over_mpich"], row
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


def test_single_copy_benchmark_checks_bytes_and_writes_every_row(tmp_path):
    # Rank 1 checks every byte each method read (AssertionError otherwise).
    bench = os.path.join(os.path.dirname(BENCH), "single_copy.py")
    out = tmp_path / "single_copy.json"
    result = run_mpi(bench, 2, timeout=120,
                     args=["--sizes", "64K", "1M", "--iters", "2", "--repeat", "1",
                           "--json", str(out)])
    assert "CMA / shm time" in result.stdout, result.stdout[-4000:]
    doc = json.loads(out.read_text())
    assert [row["bytes"] for row in doc["rows"]] == [65536, 1 << 20]
    for row in doc["rows"]:
        for method in ("shm copy-out", "local memcpy"):
            assert math.isfinite(row["seconds"][method]) and row["seconds"][method] > 0, row
        # CMA may be forbidden (ptrace rules, seccomp): then it says why.
        cma = row["seconds"]["CMA read"]
        assert (cma is not None and cma > 0) or doc["cma_error"], doc
