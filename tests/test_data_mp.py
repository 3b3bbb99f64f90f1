"""Multi-process tests of kerasdist.data at 2 and 3 ranks.

TensorFlow's import dominates an mpiexec launch, so one launch per rank
count (tests/mp/data_shards.py) runs every check, and the tests below read
its output; each asserts its own part.
"""

import importlib.util

import pytest

from conftest import run_mpi

HAVE_TFDS = importlib.util.find_spec("tensorflow_datasets") is not None
_RUNS = {}


@pytest.fixture(scope="module")
def data_run(tmp_path_factory):
    def run(np_):
        if np_ not in _RUNS:
            tmp = tmp_path_factory.mktemp(f"data_np{np_}")
            _RUNS[np_] = run_mpi("data_shards.py", np_, timeout=180, args=[tmp]).stdout
        return _RUNS[np_]
    return run


@pytest.mark.parametrize("np_", [2, 3])
def test_shards_equal_steps_files_and_errors_on_every_rank(data_run, np_):
    out = data_run(np_)
    # Ranks print concurrently, so lines may interleave: count, don't match.
    assert out.count("OK") == np_
    assert out.count("check_equal_steps:") == np_  # the error reached every rank
    assert out.count("shard_files mismatch:") == np_


@pytest.mark.skipif(not HAVE_TFDS, reason="tensorflow-datasets is not installed")
@pytest.mark.parametrize("np_", [2, 3])
def test_tfds_split_disjoint_equal_parts(data_run, np_):
    out = data_run(np_)
    sizes = [str(11 // np_)] * np_
    assert f"drop_remainder=True part sizes [{', '.join(sizes)}]" in out
    assert out.count("] tfds: ok") == np_
