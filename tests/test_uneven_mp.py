"""Uneven data never hangs: join() semantics and model.fit integration."""

import pytest

from conftest import run_mpi


@pytest.mark.parametrize("np_", [2, 3])
def test_join_leaves_joined_ranks_out_of_averages(np_):
    out = run_mpi("join.py", np_, timeout=120).stdout
    assert out.count(f"join ok, last {np_ - 1}") == np_


def test_fit_with_unknown_uneven_lengths_joins_and_stays_identical():
    out = run_mpi("uneven_fit.py", 3, timeout=180, args=["unknown"]).stdout
    assert out.count("finished with identical weights") == 3


def test_fit_with_known_uneven_lengths_fails_before_first_step():
    out = run_mpi("uneven_fit.py", 2, timeout=120, args=["known"]).stdout
    assert out.count("uneven known lengths rejected") == 2
