"""kerasdist.jax under mpiexec at np=2 and np=3: every collective eagerly
and inside `jax.jit` against numpy, gradients, process sets, bad input, and
collectives issued in a rank-dependent order. They run with TensorFlow,
Keras and PyTorch blocked from importing (tests/no_framework/
sitecustomize.py), so the binding is shown to need JAX and the engine
library only."""

import os

import pytest

from conftest import HERE, run_mpi

pytest.importorskip("jax")

BLOCK = {"PYTHONPATH": os.pathsep.join([os.path.dirname(HERE),
                                         os.path.join(HERE, "no_framework")]),
         "KERASDIST_TEST_ALLOW": "jax,jaxlib"}

SCRIPTS = {
    "jax_collectives.py": (
        "check_allreduce_every_dtype_and_op", "check_grouped_scales_steps_and_aliasing",
        "check_allgather_broadcast_alltoall_reducescatter", "check_gradients",
        "check_process_sets"),
    "jax_errors.py": (
        "check_local_errors_are_clear", "check_mismatches_fail_on_every_rank",
        "check_rank_dependent_order_completes_when_xla_runs_them_concurrently",
        "check_rank_dependent_order_ends_within_the_bound"),
}


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_jax_binding(script, np_):
    # The deadlock rule's bound, shortened so that the crossed order ends soon.
    env = dict(BLOCK, PYTHONWARNINGS="ignore", KERASDIST_DEADLOCK_TIME_SECONDS="5")
    out = run_mpi(script, np_, timeout=300, env=env).stdout
    for name in SCRIPTS[script]:
        assert out.count(f"{name} passed") == np_, (name, out[-4000:])
    assert "tensorflow" not in out.lower(), out[-2000:]
    if script == "jax_errors.py":
        # Every rank names the tensor each rank waits on, within the bound.
        times = [float(t) for t in
                 __import__("re").findall(r"deadlock reported after ([0-9.]+) s", out)]
        assert len(times) == np_ and max(times) < 5 + 30, out[-3000:]
