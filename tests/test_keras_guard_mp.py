"""fit() never hangs by default: one-rank stops and uneven known step counts,
with only DistributedOptimizer (see tests/mp/keras_guard.py)."""

import re

from conftest import run_mpi


def test_stop_on_one_rank_stops_every_rank_without_extra_callback():
    out = run_mpi("keras_guard.py", 2, timeout=240, args=["stop"]).stdout
    assert out.count("stopped every rank at the same point") == 2, out[-4000:]


def _rejected(out, counts):
    # The same error, naming every rank's count, on every rank.
    lines = re.findall(r"^\[rank (\d)\] rejected: (.*)$", out, re.M)
    assert sorted(r for r, _ in lines) == ["0", "1"], out[-4000:]
    assert lines[0][1] == lines[1][1]
    text = lines[0][1]
    assert counts in text, text
    assert "kerasdist.data" in text and "UnevenDataCallback" in text, text


def test_uneven_numpy_arrays_fail_on_every_rank_before_the_first_step():
    result = run_mpi("keras_guard.py", 2, timeout=120, args=["uneven"], check=False)
    assert result.returncode != 0
    _rejected(result.stdout, "rank 0: 10, rank 1: 13")
    assert "uneven data was not rejected" not in result.stdout


def test_uneven_steps_per_epoch_fail_on_every_rank():
    result = run_mpi("keras_guard.py", 2, timeout=120, args=["uneven-steps"], check=False)
    assert result.returncode != 0
    _rejected(result.stdout, "rank 0: 3, rank 1: 4")
