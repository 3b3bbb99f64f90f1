"""kerasdist.torch under mpiexec at np=2 and np=3: every collective against
numpy, the DistributedOptimizer against one process, and bad input. The
collectives and errors run with TensorFlow, Keras and JAX blocked from
importing (tests/no_framework/sitecustomize.py), so the binding is shown
to need PyTorch and the engine library only."""

import os

import pytest

from conftest import HERE, run_mpi

BLOCK = {"PYTHONPATH": os.pathsep.join([os.path.dirname(HERE),
                                         os.path.join(HERE, "no_framework")]),
         "KERASDIST_TEST_ALLOW": "torch"}

SCRIPTS = {
    "torch_collectives.py": (BLOCK, (
        "check_allreduce_every_dtype_and_op", "check_scale_factors_inplace_and_noncontiguous",
        "check_async_handles_and_grouped", "check_allgather_broadcast",
        "check_alltoall_reducescatter", "check_gradients", "check_process_sets_and_join",
        "check_sparse_and_adasum", "check_objects_and_queries")),
    "torch_optimizer.py": ({}, (
        "check_matches_one_process", "check_unused_parameters_and_synchronize",
        "check_broadcast_parameters_and_optimizer_state", "check_sync_batch_norm",
        "check_elastic_state")),
    "torch_errors.py": (BLOCK, (
        "check_local_errors_are_clear", "check_mismatches_fail_on_every_rank",
        "check_name_reused_in_flight")),
}


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_torch_binding(script, np_):
    env, checks = SCRIPTS[script]
    out = run_mpi(script, np_, timeout=300, env=dict(env, PYTHONWARNINGS="ignore")).stdout
    for name in checks:
        assert out.count(f"{name} passed") == np_, (name, out[-4000:])
    assert "tensorflow" not in out.lower() or not env, out[-2000:]


def test_torch_elastic_state_resumes_a_restarted_job(tmp_path):
    import json
    import sys
    from pathlib import Path

    from test_supervise import RUNNER, run_bounded

    script = Path(HERE) / "scripts" / "elastic_torch.py"
    ref = tmp_path / "ref"
    ref.mkdir()
    run_mpi("../scripts/elastic_torch.py", 2, timeout=200, args=[ref],
            env={"KD_NO_CRASH": "1"})
    out = run_bounded([*RUNNER, "-np", 2, "--max-restarts", 1, sys.executable, script,
                       tmp_path], 300, env={"PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert "restarting the job (restart 1 of 1)" in out.stderr
    batches = [json.loads(l) for l in (tmp_path / "batches.log").read_text().splitlines()]
    want = ([[0, 0, b] for b in range(5)] + [[0, 1, b] for b in range(3)]
            + [[1, 1, 3], [1, 1, 4]] + [[1, 2, b] for b in range(5)])
    seen = [b for b in batches if b != [0, 1, 3]]  # rank 0 may log it before rank 1 dies
    assert seen == want, batches
    digests = {(tmp_path / f"weights.{r}").read_text() for r in (0, 1)}
    assert digests == {(ref / f"weights.ref.{r}").read_text() for r in (0, 1)}
    assert len(digests) == 1
