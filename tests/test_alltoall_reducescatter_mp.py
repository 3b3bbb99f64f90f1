"""Horovod's reducescatter, alltoall, grouped_allgather and broadcast_ at
np=2 and np=3 (tests/mp/alltoall.py, reducescatter.py and scatter_errors.py
under mpiexec), against numpy."""

import pytest

from conftest import run_mpi

SCRIPTS = {
    "reducescatter.py": ("check_every_dtype_op_and_split", "check_scale_factors_and_default_op",
                         "check_grouped_is_fused_and_exact", "check_in_tf_function",
                         "check_gradients", "check_keras_module"),
    "alltoall.py": ("check_every_dtype_and_split", "check_default_split_and_return_convention",
                    "check_in_tf_function", "check_gradients", "check_grouped_allgather",
                    "check_broadcast_inplace"),
    "scatter_errors.py": ("check_reducescatter_mismatches", "check_alltoall_mismatches",
                          "check_alltoall_invalid_arguments", "check_join_is_refused",
                          "check_engine_recovers", "check_before_init"),
}


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_collectives_match_numpy_and_fail_clearly(script, np_):
    out = run_mpi(script, np_, timeout=300).stdout
    for name in SCRIPTS[script]:
        assert out.count(f"{name} passed") == np_, (name, out[-4000:])


def test_alltoall_and_reducescatter_over_mpi_only():
    # The runs above use the shared-memory links between ring neighbours;
    # this one keeps every byte on MPI (staged through engine scratch).
    for script in ("alltoall.py", "reducescatter.py"):
        out = run_mpi(script, 3, timeout=300, env={"KERASDIST_SHM": "0"}).stdout
        assert out.count("check_every_dtype") == 3, out[-4000:]
