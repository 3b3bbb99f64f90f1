"""Size-1 tests of the Keras callbacks and LinearWarmup in real `model.fit`."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasdist as kd
from kerasdist.callbacks.lr_schedule import LearningRateScheduleCallback
from kerasdist.callbacks.lr_warmup import LearningRateWarmupCallback
from kerasdist.callbacks.metric_average import MetricAverageCallback
from kerasdist.callbacks.stop_sync import SyncStopTrainingCallback
from kerasdist import LinearWarmup, scale_learning_rate


@pytest.fixture(autouse=True)
def initialized():
    kd.init()
    yield


def make_model(lr=0.5, optimizer=None, run_eagerly=True):
    # Eager steps skip tracing, which dominates these tiny fits.
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer or keras.optimizers.SGD(lr, momentum=0.9),
                  loss="mse", metrics=["mae"], run_eagerly=run_eagerly)
    return model


def data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 3), np.float32), rng.random((n, 1), np.float32)


class Recorder(keras.callbacks.Callback):
    """Records the learning rate before each batch and copies of the logs."""

    def __init__(self):
        super().__init__()
        self.lrs, self.logs, self.batches = [], [], 0

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate))

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


class AddLogs(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        logs["note"] = "text"
        logs["vector"] = np.array([1.0, 2.0])


@pytest.mark.parametrize("weighted", [False, True])
def test_metric_average_is_identity_at_size_one(weighted):
    x, y = data()
    before, after = Recorder(), Recorder()
    make_model().fit(x, y, batch_size=8, epochs=2, validation_split=0.25, verbose=0,
                     callbacks=[AddLogs(), before, MetricAverageCallback(weighted),
                                after])
    assert set(after.logs[0]) == {"loss", "mae", "val_loss", "val_mae", "note", "vector"}
    for raw, avg in zip(before.logs, after.logs):
        assert avg["note"] == "text"
        np.testing.assert_allclose(avg["vector"], [1.0, 2.0])
        for key in ("loss", "mae", "val_loss", "val_mae"):
            assert isinstance(avg[key], float)
            np.testing.assert_allclose(avg[key], raw[key], rtol=1e-6)


def test_metric_average_counts_batches_and_handles_empty_logs():
    cb = MetricAverageCallback(weighted=True)
    cb.on_epoch_begin(0)
    for b in range(3):
        cb.on_train_batch_end(b)
    cb.on_test_begin()
    cb.on_test_batch_end(1)  # steps_per_execution=2: one call for 2 batches
    assert (cb._train_batches, cb._val_batches) == (3, 2)
    logs = {"loss": np.float32(2.0), "val_loss": 4.0}
    cb.on_epoch_end(0, logs)
    assert logs == {"loss": 2.0, "val_loss": 4.0}
    cb.on_epoch_end(1, {})
    cb.on_epoch_end(2, None)
    with pytest.raises(ValueError, match=r"Invalid value for argument `weighted`"):
        MetricAverageCallback(weighted=1)


def test_warmup_at_size_one_keeps_initial_lr(capsys):
    x, y = data()
    rec = Recorder()
    model = make_model(lr=0.5, run_eagerly=False)
    model.fit(x, y, batch_size=8, epochs=3, verbose=0,
              callbacks=[LearningRateWarmupCallback(0.1, warmup_epochs=2, verbose=1), rec])
    np.testing.assert_allclose(rec.lrs, [0.1] * 12, rtol=1e-6)
    np.testing.assert_allclose(float(model.optimizer.learning_rate), 0.1, rtol=1e-6)
    assert [log["learning_rate"] for log in rec.logs] == pytest.approx([0.1] * 3)
    out = capsys.readouterr().out
    assert "Epoch 2: finished learning rate warmup to 0.1." in out
    assert out.count("momentum_correction") == 1
    # Without momentum (Adam) there is nothing to correct and no note.
    model = make_model(optimizer=keras.optimizers.Adam(0.5), run_eagerly=False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=[LearningRateWarmupCallback(0.1, warmup_epochs=2, verbose=1)])
    assert "momentum_correction" not in capsys.readouterr().out


def test_warmup_errors():
    x, y = data()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    model = make_model(optimizer=keras.optimizers.SGD(schedule))
    with pytest.raises(ValueError, match=r"kerasdist.LinearWarmup"):
        model.fit(x, y, epochs=1, verbose=0,
                  callbacks=[LearningRateWarmupCallback(0.1)])
    # A generator dataset has no known length: steps per epoch are unknown.
    ds = tf.data.Dataset.from_generator(
        lambda: iter([(x[:8], y[:8])] * 2),
        output_signature=(tf.TensorSpec([None, 3]), tf.TensorSpec([None, 1])))
    with pytest.raises(ValueError, match=r"steps_per_epoch="):
        make_model().fit(ds, epochs=1, verbose=0, shuffle=False,
                         callbacks=[LearningRateWarmupCallback(0.1)])
    for kwargs, arg in [({"initial_lr": -1.0}, "initial_lr"),
                        ({"initial_lr": 0.1, "warmup_epochs": 0}, "warmup_epochs"),
                        ({"initial_lr": 0.1, "steps_per_epoch": 0}, "steps_per_epoch")]:
        with pytest.raises(ValueError, match=rf"Invalid value for argument `{arg}`"):
            LearningRateWarmupCallback(**kwargs)


def test_schedule_callback_staircase_smooth_and_range():
    x, y = data()
    rec = Recorder()
    make_model().fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[
        LearningRateScheduleCallback(0.1, lambda e: 0.5 ** e), rec])
    np.testing.assert_allclose(rec.lrs, np.repeat([0.1, 0.05, 0.025], 4), rtol=1e-6)
    assert [log["learning_rate"] for log in rec.logs] == pytest.approx([0.1, 0.05, 0.025])

    rec = Recorder()
    make_model().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[
        LearningRateScheduleCallback(0.1, lambda e: 1 + e, staircase=False), rec])
    expected = [0.1 * (1 + e + b / 4) for e in range(2) for b in range(4)]
    np.testing.assert_allclose(rec.lrs, expected, rtol=1e-6)

    # A constant multiplier only inside [start_epoch, end_epoch).
    rec = Recorder()
    make_model(lr=0.5).fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[
        LearningRateScheduleCallback(0.1, 0.1, start_epoch=1, end_epoch=3), rec])
    np.testing.assert_allclose(rec.lrs, np.repeat([0.5, 0.01, 0.01, 0.01], 4), rtol=1e-6)

    for kwargs, arg in [({"multiplier": "x"}, "multiplier"),
                        ({"multiplier": 1.0, "start_epoch": -1}, "start_epoch"),
                        ({"multiplier": 1.0, "start_epoch": 2, "end_epoch": 2}, "end_epoch")]:
        with pytest.raises(ValueError, match=rf"Invalid value for argument `{arg}`"):
            LearningRateScheduleCallback(0.1, **kwargs)


def test_sync_stop_at_size_one():
    x, y = data()

    class StopAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                self.model.stop_training = True

    rec = Recorder()
    make_model().fit(x, y, batch_size=4, epochs=3, verbose=0,
                     callbacks=[StopAt(), rec, SyncStopTrainingCallback()])
    assert rec.batches == 3 and len(rec.logs) == 1
    rec = Recorder()
    make_model().fit(x, y, batch_size=8, epochs=3, verbose=0,
                     callbacks=[rec, SyncStopTrainingCallback()])
    assert rec.batches == 12 and len(rec.logs) == 3


def test_linear_warmup_values_eager_and_symbolic():
    decay = keras.optimizers.schedules.ExponentialDecay(0.4, 10, 0.5)
    plain = LinearWarmup(0.4, warmup_steps=10, world_size=4)
    chained = LinearWarmup(0.4, warmup_steps=10, world_size=4, after=decay)
    expected = {0: 0.1, 5: 0.25, 9: 0.37, 10: 0.4, 20: 0.4}
    for step, lr in expected.items():
        np.testing.assert_allclose(float(plain(step)), lr, rtol=1e-6)
    np.testing.assert_allclose(float(chained(5)), 0.25, rtol=1e-6)
    np.testing.assert_allclose(float(chained(20)), 0.2, rtol=1e-6)  # decay(10)
    step = tf.Variable(0, dtype=tf.int64)
    fn = tf.function(lambda: chained(step))
    for s, lr in [(0, 0.1), (5, 0.25), (30, 0.1)]:
        step.assign(s)
        np.testing.assert_allclose(float(fn()), lr, rtol=1e-6)
    assert LinearWarmup(0.4, 10).world_size == kd.size() == 1
    np.testing.assert_allclose(float(LinearWarmup(0.4, 0, world_size=4)(0)), 0.4)
    assert scale_learning_rate(0.01) == pytest.approx(0.01 * kd.size())


def test_linear_warmup_serialization_and_model_save(tmp_path):
    decay = keras.optimizers.schedules.CosineDecay(0.4, decay_steps=100)
    schedule = LinearWarmup(0.4, warmup_steps=10, world_size=4, after=decay)
    config = keras.optimizers.schedules.serialize(schedule)
    assert config["registered_name"] == "kerasdist>LinearWarmup"
    restored = keras.optimizers.schedules.deserialize(config)
    assert isinstance(restored, LinearWarmup) and isinstance(restored.after, type(decay))
    assert restored.get_config() == schedule.get_config()
    for s in (3, 50):
        np.testing.assert_allclose(float(restored(s)), float(schedule(s)), rtol=1e-6)

    x, y = data()
    model = make_model(optimizer=keras.optimizers.Adam(schedule), run_eagerly=False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    lr_config = loaded.optimizer.get_config()["learning_rate"]
    assert lr_config["registered_name"] == "kerasdist>LinearWarmup"
    assert lr_config["config"]["world_size"] == 4
    assert int(loaded.optimizer.iterations) == 4
    np.testing.assert_allclose(float(loaded.optimizer.learning_rate), float(schedule(4)),
                               rtol=1e-6)


def test_linear_warmup_and_scale_errors():
    cases = [({"target_lr": 0}, "target_lr"), ({"warmup_steps": -1}, "warmup_steps"),
             ({"warmup_steps": 2.5}, "warmup_steps"), ({"world_size": 0}, "world_size"),
             ({"after": lambda s: 0.1}, "after")]
    for override, arg in cases:
        kwargs = {"target_lr": 0.1, "warmup_steps": 10, **override}
        with pytest.raises(ValueError, match=rf"Invalid value for argument `{arg}`"):
            LinearWarmup(**kwargs)
    with pytest.raises(ValueError, match=r"Invalid value for argument `lr`"):
        scale_learning_rate("0.1")
    kd.shutdown()
    with pytest.raises(RuntimeError, match=r"kerasdist.init\(\)"):
        LinearWarmup(0.1, 10)
    kd.init()
