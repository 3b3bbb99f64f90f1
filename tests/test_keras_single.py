"""Keras layer at size 1 (plain pytest): everything works, errors are clear."""

import keras
import numpy as np
import pytest

import kerasdist as kd
from kerasdist._keras.optimizer import is_distributed


@pytest.fixture(autouse=True)
def initialized():
    kd.init()
    yield


def small_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])


def xy():
    x = np.random.RandomState(0).rand(32, 4).astype("float32")
    return x, x.sum(1, keepdims=True)


@pytest.mark.parametrize("opt_cls", [keras.optimizers.SGD, keras.optimizers.Adam,
                                     keras.optimizers.AdamW, keras.optimizers.RMSprop,
                                     keras.optimizers.Adadelta, keras.optimizers.Adagrad,
                                     keras.optimizers.Nadam, keras.optimizers.Lion])
def test_wraps_every_optimizer_and_matches_plain_keras_at_size_one(opt_cls):
    x, y = xy()
    plain = small_model()
    plain.compile(opt_cls(learning_rate=0.01), "mse")
    plain.fit(x, y, batch_size=8, epochs=1, verbose=0)
    dist = small_model()
    opt = kd.DistributedOptimizer(opt_cls(learning_rate=0.01))
    assert is_distributed(opt) and isinstance(opt, opt_cls)
    assert type(opt).__name__ == opt_cls.__name__
    dist.compile(opt, "mse")
    dist.fit(x, y, batch_size=8, epochs=1, verbose=0,
             callbacks=[kd.callbacks.BroadcastGlobalVariablesCallback(0)])
    for a, b in zip(plain.weights, dist.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    assert opt.get_config()["learning_rate"] == pytest.approx(0.01)


def test_user_subclass_and_schedule():
    class MySGD(keras.optimizers.SGD):
        pass

    sched = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    opt = kd.DistributedOptimizer(MySGD(learning_rate=sched))
    assert isinstance(opt, MySGD)
    model = small_model()
    model.compile(opt, "mse")
    model.fit(*xy(), batch_size=8, epochs=1, verbose=0)
    assert int(opt.iterations) == 4


def test_horovod_idioms_give_keras3_replacements():
    opt = kd.DistributedOptimizer(keras.optimizers.Adam(0.1), backward_passes_per_step=1,
                                  average_aggregated_gradients=True)
    with pytest.raises(AttributeError, match="optimizer.learning_rate"):
        opt.lr
    with pytest.raises(ValueError, match="Invalid value for argument `op`"):
        kd.DistributedOptimizer(keras.optimizers.Adam(), op=kd.Max)
    with pytest.raises(ValueError, match="Keras 3 optimizer"):
        kd.DistributedOptimizer("adam")


def test_explicit_jit_compile_is_a_clear_error():
    model = small_model()
    model.compile(kd.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse", jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile=False"):
        model.fit(*xy(), batch_size=8, epochs=1, verbose=0)


def test_backward_passes_per_step_accumulates():
    opt = kd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
    assert opt.gradient_accumulation_steps == 2
    model = small_model()
    model.compile(opt, "mse")
    before = [w.numpy().copy() for w in model.weights] if model.built else None
    model.fit(*xy(), batch_size=8, epochs=1, verbose=0)
    assert int(opt.iterations) == 2  # 4 batches, one update per 2 of them
    assert before is None or any(
        not np.array_equal(a, b.numpy()) for a, b in zip(before, model.weights))


def test_checkpoint_and_backup_at_size_one(tmp_path):
    model = small_model()
    model.compile(kd.DistributedOptimizer(keras.optimizers.Adam(0.01)), "mse")
    path = tmp_path / "best.keras"
    cb = kd.callbacks.ModelCheckpoint(str(path), monitor="loss", save_best_only=True)
    model.fit(*xy(), batch_size=8, epochs=2, verbose=0,
              callbacks=[cb, kd.callbacks.BackupAndRestore(str(tmp_path / "bk"))])
    assert path.exists() and not (tmp_path / "bk" / "state.npz").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []
    loaded = kd.load_model(str(path))
    assert is_distributed(loaded.optimizer)
    with pytest.raises(ValueError, match="ending in `.keras`"):
        kd.callbacks.ModelCheckpoint(str(tmp_path / "x.h5"))
