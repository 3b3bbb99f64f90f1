"""Keras 3 on the torch and JAX backends with kerasdist, under mpiexec at
np=2 and np=3, with TensorFlow (and the other framework) blocked from
importing: DistributedOptimizer in `fit` and in a custom loop against one
process, gradient accumulation, loss scaling, every callback,
SyncBatchNormalization, the data helpers, and unequal step counts
(tests/mp/keras_common.py, keras_torch.py, keras_jax.py). On torch,
`torch.distributed` must stay uninitialized (Keras would wrap the model in
DDP); on JAX, `jax.distributed` must, and the custom loop jits
`stateless_apply`. And `kerasdist.run`, the notebook launcher, on each."""

import os

import pytest

from conftest import HERE, run_mpi

BACKENDS = {"torch": "torch,keras", "jax": "jax,jaxlib,keras"}
CHECKS = ("check_fit_matches_one_process", "check_custom_loop_matches_one_process",
          "check_accumulation_and_loss_scaling", "check_sync_batch_norm",
          "check_data_helpers", "check_unequal_steps_fail_on_every_rank",
          "check_uneven_data_schedule_and_stop_sync", "check_optimizer_options",
          "check_callbacks")


def _env(backend):
    return {"KERAS_BACKEND": backend, "KERASDIST_TEST_ALLOW": BACKENDS[backend],
            "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE),
                                           os.path.join(HERE, "no_framework")]),
            "PYTHONWARNINGS": "ignore"}


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_keras_on_another_backend(backend, np_, tmp_path):
    pytest.importorskip(backend)
    out = run_mpi(f"keras_{backend}.py", np_, timeout=400,
                  env=dict(_env(backend), KD_TMP=str(tmp_path))).stdout
    for name in CHECKS:
        assert out.count(f"{name} passed") == np_, (name, out[-4000:])


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_kerasdist_run_trains_on_another_backend(backend):
    """`kerasdist.run` (the notebook launcher) with KERAS_BACKEND set: a
    closure trains with `fit` on 2 ranks; the replicas come back equal."""
    import contextlib
    import io

    from kerasdist.runner.launch import run

    pytest.importorskip(backend)
    steps = 5

    def train():
        import keras
        import numpy as np

        import kerasdist as kd

        kd.init()
        keras.utils.set_random_seed(kd.rank())
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                      loss="mse")
        rng = np.random.default_rng(kd.rank())
        model.fit(rng.normal(size=(4 * steps, 3)), rng.normal(size=(4 * steps, 2)),
                  batch_size=4, verbose=0)
        return keras.config.backend(), [keras.ops.convert_to_numpy(v).tolist()
                                        for v in model.weights]

    with contextlib.redirect_stdout(io.StringIO()):
        results = run(train, np=2, timeout=240,
                      env={"KERAS_BACKEND": backend, "PYTHONWARNINGS": "ignore"})
    assert [b for b, _ in results] == [backend, backend]
    assert results[0][1] == results[1][1]
