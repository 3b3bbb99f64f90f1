"""Horovod's TensorFlow 1 (tf.compat.v1 graph and session) API at np=2 and
np=4, the latter with static even/odd process sets given to init():
object collectives, variable broadcasts, gradients' collective names and
elastic.TensorFlowState (tests/mp/*.py under mpiexec)."""

import pytest

from conftest import run_mpi

SCRIPTS = {
    "graph_objects.py": ("check_global", "check_process_sets"),
    "graph_variables.py": ("check_broadcast_variables", "check_broadcast_global_variables"),
    "graph_grad_names.py": ("check_broadcast_gradient", "check_names_follow_the_forward_op"),
}


@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_parity_graph(script, np_):
    # A short deadlock bound: ranks that disagree on a name fail in seconds.
    out = run_mpi(f"{script}", np_, timeout=300,
                  env={"KERASDIST_DEADLOCK_TIME_SECONDS": "10"}).stdout
    for name in SCRIPTS[script]:
        assert out.count(f"{name} passed") == np_, (name, out[-4000:])


def test_elastic_tensorflow_state(tmp_path):
    out = run_mpi("elastic_tf_state.py", 2, timeout=300,
                  env={"KD_PARITY_TMP": str(tmp_path)}).stdout
    for name in ("check_eager", "check_graph"):
        assert out.count(f"{name} passed") == 2, (name, out[-4000:])
