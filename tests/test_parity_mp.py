"""Horovod parity at np=2 and np=3 (tests/parity/*.py under mpiexec)."""

import pytest

from conftest import run_mpi

CHECKS = ("check_sparse_predivide", "check_mismatch_and_objects",
          "check_average_argument", "check_queries", "check_tape",
          "check_partial_optimizer", "check_sync_batch_norm", "check_keras_module")


@pytest.mark.parametrize("np_", [2, 3])
def test_parity_checks(np_, tmp_path):
    out = run_mpi("../parity/checks.py", np_, timeout=300,
                  env={"KD_PARITY_TMP": str(tmp_path)}).stdout
    for name in CHECKS:
        assert out.count(f"{name} passed") == np_, (name, out[-4000:])


def test_horovod_tf2_custom_loop_ends_with_identical_replicas(tmp_path):
    out = run_mpi("../parity/tensorflow2_mnist.py", 2, timeout=400,
                  env={"KD_PARITY_TMP": str(tmp_path), "KD_PARITY_STEPS": "100"}).stdout
    assert out.count("replicas identical") == 2, out[-4000:]
    assert (tmp_path / "checkpoints-1.index").exists()


@pytest.mark.parametrize("np_", [2, 3])
def test_forgotten_broadcast_still_gives_identical_replicas(np_):
    out = run_mpi("../parity/forgot_broadcast.py", np_, timeout=300).stdout
    for what in ("fit", "custom loop", "callback"):
        assert out.count(f"{what} replicas identical") == np_, (what, out[-4000:])
