"""Multi-process tests of the Keras callbacks: each script runs on 2 ranks
under the environment's mpiexec with a hard timeout (see tests/mp/cb_*.py)."""

from conftest import run_mpi


def test_metric_average_plain_weighted_and_key_mismatch():
    out = run_mpi("cb_metrics.py", 2, timeout=180).stdout
    assert out.count("weighted mean ok") == 2 and out.count("key mismatch errors ok") == 2
    assert out.count("OK") == 2


def test_warmup_learning_rates_follow_the_formula():
    out = run_mpi("cb_warmup.py", 2, timeout=180).stdout
    assert out.count("finished learning rate warmup to 0.2") == 1  # rank 0 only
    assert out.count("OK") == 2


def test_stop_on_one_rank_stops_every_rank_at_the_same_point():
    out = run_mpi("cb_stop.py", 2, timeout=180).stdout
    assert out.count("stop sync ok") == 2 and out.count("OK") == 2


def test_backup_and_restore_errors_reach_every_rank(tmp_path):
    out = run_mpi("cb_backup_errors.py", 2, timeout=240, args=[tmp_path]).stdout
    for case in ("garbage", "truncated", "unreadable", "other-model", "write"):
        assert out.count(f"{case}: the same error on every rank") == 2, out[-4000:]
    assert out.count("backup errors ok") == 2
