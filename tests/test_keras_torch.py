"""Keras 3 on the torch backend with kerasdist, under mpiexec at np=2 and
np=3, with TensorFlow (and JAX) blocked from importing: DistributedOptimizer
in `fit` and in a custom loop against one process, gradient accumulation,
loss scaling, every callback, SyncBatchNormalization, the data helpers, and
unequal step counts. `torch.distributed` must stay uninitialized (no DDP).
And `kerasdist.run`, the notebook launcher, on that backend."""

import os

import pytest

from conftest import HERE, run_mpi

ENV = {"KERAS_BACKEND": "torch",
       "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.path.join(HERE, "no_framework")]),
       "KERASDIST_TEST_ALLOW": "torch,keras", "PYTHONWARNINGS": "ignore"}
CHECKS = ("check_fit_matches_one_process", "check_custom_loop_matches_one_process",
          "check_accumulation_and_loss_scaling", "check_sync_batch_norm",
          "check_data_helpers", "check_unequal_steps_fail_on_every_rank",
          "check_uneven_data_schedule_and_stop_sync", "check_optimizer_options",
          "check_callbacks")


@pytest.mark.parametrize("np_", [2, 3])
def test_keras_on_the_torch_backend(np_, tmp_path):
    out = run_mpi("keras_torch.py", np_, timeout=400,
                  env=dict(ENV, KD_TMP=str(tmp_path))).stdout
    for name in CHECKS:
        assert out.count(f"{name} passed") == np_, (name, out[-4000:])



def test_kerasdist_run_trains_on_the_torch_backend():
    """`kerasdist.run` (the notebook launcher) with KERAS_BACKEND=torch: a
    closure trains with `fit` on 2 ranks; the replicas come back equal."""
    import contextlib
    import io

    from kerasdist.runner.launch import run

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
                      env={"KERAS_BACKEND": "torch", "PYTHONWARNINGS": "ignore"})
    assert [backend for backend, _ in results] == ["torch", "torch"]
    assert results[0][1] == results[1][1]
