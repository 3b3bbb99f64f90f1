"""Size-1 tests: atomic_save's temporary files, ModelCheckpoint(mode="auto")
as in Keras 3, and which callbacks make fit's guard check every batch."""

import os
import stat

import keras
import numpy as np
import pytest

import kerasdist as kd
from kerasdist._keras import fit_guard as _fit_guard
from kerasdist.callbacks.model_checkpoint import ModelCheckpoint
from kerasdist.common.files import atomic_save


@pytest.fixture(autouse=True)
def initialized():
    kd.init()
    yield


def write_bytes(data):
    def save(path):
        with open(path, "wb") as f:
            f.write(data)
    return save


def test_atomic_save_never_writes_through_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    target = tmp_path / "model.keras"
    # The name the old implementation always used for this process.
    planted = tmp_path / f".tmp-{os.getpid()}-model.keras"
    planted.symlink_to(victim)
    seen = []

    def save(path):
        seen.append(path)
        assert os.path.dirname(path) == str(tmp_path)  # same folder: atomic rename
        assert path.endswith(".keras") and not os.path.islink(path)
        assert os.path.getsize(path) == 0  # a fresh, empty file of ours
        write_bytes(b"new")(path)

    atomic_save(save, target)
    atomic_save(save, target)
    assert victim.read_bytes() == b"precious"
    assert target.read_bytes() == b"new"
    assert seen[0] != seen[1]  # not predictable
    assert os.path.islink(planted)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["victim", "model.keras", planted.name])


def test_atomic_save_mode_suffix_failure_and_swapped_temp(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_save(write_bytes(b"1"), tmp_path / "w.weights.h5")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "w.weights.h5").st_mode) == 0o640
    names = []
    atomic_save(lambda p: (names.append(p), write_bytes(b"2")(p)), tmp_path / "w.weights.h5")
    assert names[0].endswith(".weights.h5")

    def fails(path):
        write_bytes(b"half")(path)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_save(fails, tmp_path / "w.weights.h5")
    assert (tmp_path / "w.weights.h5").read_bytes() == b"2"
    assert sorted(os.listdir(tmp_path)) == ["w.weights.h5"]

    # The temporary path replaced by a symlink while saving: nothing moves
    # into place, and the link (not its target) is removed.
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")

    def swapped(path):
        os.remove(path)
        os.symlink(victim, path)

    with pytest.raises(OSError, match="was replaced while it was being written"):
        atomic_save(swapped, tmp_path / "w.weights.h5")
    assert (tmp_path / "w.weights.h5").read_bytes() == b"2"
    assert victim.read_bytes() == b"precious"
    assert sorted(os.listdir(tmp_path)) == ["victim", "w.weights.h5"]


def test_atomic_save_with_keras_writers(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    atomic_save(model.save, tmp_path / "m.keras")
    atomic_save(model.save_weights, tmp_path / "m.weights.h5")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.weights[0].numpy(), model.weights[0].numpy())
    assert sorted(os.listdir(tmp_path)) == ["m.keras", "m.weights.h5"]


def fitted_model(metric):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy", metrics=[metric])
    x = np.random.default_rng(0).random((8, 3), np.float32)
    model.fit(x, (x[:, :1] > 0.5).astype("float32"), epochs=1, verbose=0)
    return model


def best_after(ckpt, model, values, key):
    ckpt.set_model(model)
    for epoch, value in enumerate(values):
        ckpt.on_epoch_end(epoch, {key: value})
    return ckpt.best


@pytest.mark.parametrize("key", ["score", "val_score"])
def test_checkpoint_auto_mode_follows_the_metric_not_its_name(tmp_path, key):
    # AUC goes up; the name "score" says nothing.
    model = fitted_model(keras.metrics.AUC(name="score"))
    ckpt = ModelCheckpoint(str(tmp_path / "m.keras"), monitor=key, save_best_only=True)
    assert best_after(ckpt, model, [0.5, 0.4, 0.6, 0.55], key) == 0.6
    assert ckpt.mode == "auto" and os.path.exists(tmp_path / "m.keras")
    # An error metric whose name contains "acc" still goes down.
    model = fitted_model(keras.metrics.MeanAbsoluteError(name="acc_gap"))
    ckpt = ModelCheckpoint(str(tmp_path / "n.keras"), monitor="acc_gap", save_best_only=True)
    assert best_after(ckpt, model, [0.5, 0.4, 0.6], "acc_gap") == 0.4
    # Loss is minimized; an explicit mode wins over the metric.
    ckpt = ModelCheckpoint(str(tmp_path / "o.keras"), monitor="val_loss", save_best_only=True)
    assert best_after(ckpt, model, [0.5, 0.4, 0.6], "val_loss") == 0.4
    ckpt = ModelCheckpoint(str(tmp_path / "p.keras"), monitor="acc_gap", mode="max",
                           save_best_only=True)
    assert best_after(ckpt, model, [0.5, 0.4, 0.6], "acc_gap") == 0.6


def test_checkpoint_auto_mode_unknown_direction_is_an_error(tmp_path):
    # A plain function wrapped as a metric declares no direction.
    model = fitted_model(keras.metrics.MeanMetricWrapper(lambda t, p: p, name="thing"))
    ckpt = ModelCheckpoint(str(tmp_path / "m.keras"), monitor="thing", save_best_only=True)
    ckpt.set_model(model)
    with pytest.raises(ValueError, match="cannot tell whether `thing` should be maximized"):
        ckpt.on_epoch_end(0, {"thing": 1.0})
    with pytest.raises(ValueError, match="Invalid value for argument `mode`"):
        ModelCheckpoint(str(tmp_path / "m.keras"), mode="up")


class Quiet(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        pass


class Batchy(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


class MyCheckpoint(keras.callbacks.ModelCheckpoint):
    def on_train_batch_end(self, batch, logs=None):
        self.model.stop_training = True


def test_which_callbacks_turn_on_the_per_batch_stop_check(tmp_path):
    path = str(tmp_path / "m.keras")
    may = _fit_guard.may_stop_in_batch
    assert may(keras.callbacks.TerminateOnNaN())  # on_batch_end
    assert may(Batchy()) and may(MyCheckpoint(path))
    assert may(keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, l: None))
    for cb in (Quiet(), keras.callbacks.EarlyStopping(), keras.callbacks.ModelCheckpoint(path),
               keras.callbacks.ProgbarLogger(), keras.callbacks.LambdaCallback(),
               kd.callbacks.MetricAverageCallback(), kd.callbacks.SyncStopTrainingCallback(),
               kd.callbacks.BroadcastGlobalVariablesCallback(0),
               kd.callbacks.LearningRateWarmupCallback(0.1), ModelCheckpoint(path),
               kd.callbacks.BackupAndRestore(str(tmp_path)), kd.callbacks.UnevenDataCallback()):
        assert not may(cb), cb


def test_fit_wrapper_is_installed_once_and_transparent_at_size_one():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(kd.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    assert getattr(keras.Model.fit, "_kerasdist_guarded", False)
    _fit_guard.install()
    assert keras.Model.fit.__wrapped__ is _fit_guard._ORIGINAL_FIT
    x = np.ones((8, 3), np.float32)
    callbacks = [Quiet()]
    history = model.fit(x, x[:, :1], 4, 2, 0, callbacks)  # positional arguments
    assert history.epoch == [0, 1] and callbacks == [callbacks[0]]
