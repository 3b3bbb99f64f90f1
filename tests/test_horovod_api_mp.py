"""Horovod's API semantics at np=2 and np=3, Horovod's TF2 example, the first
update's broadcast and the elastic state (rank scripts under mpiexec)."""

from pathlib import Path

import pytest

from conftest import run_mpi

CHECKS = ("check_sparse_predivide", "check_mismatch_and_objects",
          "check_average_argument", "check_queries", "check_tape",
          "check_partial_optimizer", "check_sync_batch_norm", "check_keras_module")


@pytest.mark.parametrize("np_", [2, 3])
def test_horovod_api_checks(np_, tmp_path):
    out = run_mpi("horovod_api.py", np_, timeout=300,
                  env={"KD_TEST_TMP": str(tmp_path)}).stdout
    for name in CHECKS:
        assert out.count(f"{name} passed") == np_, (name, out[-4000:])


def test_horovod_tf2_custom_loop_ends_with_identical_replicas(tmp_path):
    out = run_mpi("../horovod_compat/horovod_style_tf2_mnist.py", 2, timeout=400,
                  env={"KD_TEST_TMP": str(tmp_path), "KD_TF2_MNIST_STEPS": "100"}).stdout
    assert out.count("replicas identical") == 2, out[-4000:]
    assert (tmp_path / "checkpoints-1.index").exists()


@pytest.mark.parametrize("np_", [2, 3])
def test_forgotten_broadcast_still_gives_identical_replicas(np_):
    out = run_mpi("first_update_broadcast.py", np_, timeout=300).stdout
    for what in ("fit", "unbuilt model", "custom loop", "callback"):
        assert out.count(f"{what} replicas identical") == np_, (what, out[-4000:])


def test_elastic_state_resumes_a_restarted_job_at_the_last_committed_batch(tmp_path):
    import json
    import sys

    from test_supervise import RUNNER, run_bounded

    script = Path(__file__).parent / "scripts" / "elastic_fit.py"
    ref = tmp_path / "ref"
    ref.mkdir()
    run_mpi("../scripts/elastic_fit.py", 2, timeout=200, args=[ref],
            env={"KD_NO_CRASH": "1"})
    out = run_bounded([*RUNNER, "-np", 2, "--max-restarts", 1,
                       sys.executable, script, tmp_path], 300,
                      env={"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert "restarting the job (restart 1 of 1)" in out.stderr
    starts = [json.loads(l) for l in (tmp_path / "starts.log").read_text().splitlines()]
    assert starts == [[0, 0, 0, []], [1, 1, 3, [2]]], starts
    batches = [json.loads(l) for l in (tmp_path / "batches.log").read_text().splitlines()]
    want = ([[0, 0, b] for b in range(5)] + [[0, 1, b] for b in range(3)]
            + [[1, 1, 3], [1, 1, 4]] + [[1, 2, b] for b in range(5)])
    # Rank 0 may log batch 3 of epoch 1 on the first attempt before rank 1 dies.
    seen = [b for b in batches if b != [0, 1, 3]]
    assert seen == want, batches
    digests = {(tmp_path / f"weights.{r}").read_text() for r in (0, 1)}
    assert digests == {(ref / f"weights.ref.{r}").read_text() for r in (0, 1)}
    assert len(digests) == 1
