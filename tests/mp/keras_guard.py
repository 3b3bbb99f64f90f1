"""fit() with only DistributedOptimizer (and the broadcast callback): a stop on
one rank stops every rank at the same point; different known step counts are
an error on every rank before the first step.

argv: mode, one of
  stop     four one-rank stops (custom callback at a batch and at an epoch
           end on rank 1 only, keras EarlyStopping on rank 1 only, and
           TerminateOnNaN with a NaN in rank 1's data); no
           SyncStopTrainingCallback anywhere
  uneven   numpy arrays of 100 and 130 samples: must raise (not hang)
  uneven-steps  a repeated dataset with steps_per_epoch 3 and 4
"""

import sys

import keras
import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main

MODE = sys.argv[1]


class StopOn(keras.callbacks.Callback):
    """Sets `stop_training` after (epoch, batch), or at the end of `epoch`."""

    def __init__(self, epoch, batch=None):
        super().__init__()
        self.epoch, self.batch, self.current = epoch, batch, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.batch is not None and (self.current, batch) == (self.epoch, self.batch):
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if self.batch is None and epoch == self.epoch:
            self.model.stop_training = True


def model():
    keras.utils.set_random_seed(kd.rank())  # different inits: the broadcast fixes them
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    m.compile(kd.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse", metrics=["mae"])
    return m


def data(n, nan_at=None):
    rng = np.random.default_rng(kd.rank())
    x = rng.random((n, 3), np.float32)
    if nan_at is not None:
        x[nan_at] = np.nan
    return x, x.sum(1, keepdims=True) * (kd.rank() + 1)


def fit(callbacks_rank1=(), callbacks_all=(), nan_at=None):
    """32 samples, batch 8: 4 batches per epoch, at most 5 epochs."""
    m = model()
    x, y = data(32, nan_at if kd.rank() == 1 else None)
    callbacks = [kd.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks_all]
    if kd.rank() == 1:
        callbacks += list(callbacks_rank1)
    history = m.fit(x, y, batch_size=8, epochs=5, verbose=0, shuffle=False,
                    callbacks=callbacks)
    # Counted without any batch-level callback on rank 0.
    counts = (len(history.epoch), int(m.optimizer.iterations))
    w = np.concatenate([v.numpy().ravel() for v in m.weights])
    everyone = kd.allgather_object((counts, w), name="test.guard.result")
    assert all(c == everyone[0][0] for c, _ in everyone), [c for c, _ in everyone]
    assert all(np.array_equal(everyone[0][1], o, equal_nan=True) for _, o in everyone), \
        "replicas differ"
    return counts


def stop():
    # A custom callback on rank 1 only stops after batch 2 of epoch 1.
    assert fit([StopOn(epoch=1, batch=2)]) == (2, 7)
    # ... or at the end of epoch 1 (EarlyStopping-like).
    assert fit([StopOn(epoch=1)]) == (2, 8)
    # Keras' EarlyStopping, on rank 1 only: nothing counts as an improvement
    # after epoch 0, so it stops at the end of epoch 1.
    es = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)
    assert fit([es]) == (2, 8)
    # TerminateOnNaN on every rank: rank 1's loss is NaN at batch 2 (rank
    # 0's only at batch 3, after the averaged NaN update).
    counts = fit(callbacks_all=[keras.callbacks.TerminateOnNaN()], nan_at=8 * 2 + 1)
    assert counts == (1, 3), counts
    # Nobody stops: all epochs run.
    assert fit([StopOn(epoch=99)]) == (5, 20)
    log("one-rank stops stopped every rank at the same point")


def rejected(fit_call):
    """Runs the fit; logs its error on one line and re-raises (exit 1)."""
    try:
        fit_call()
    except ValueError as e:
        log("rejected:", " ".join(str(e).split()))
        raise
    raise AssertionError("uneven data was not rejected")


def uneven():
    m = model()
    x, y = data(100 if kd.rank() == 0 else 130)
    rejected(lambda: m.fit(x, y, batch_size=10, epochs=2, verbose=0, callbacks=[
        kd.callbacks.BroadcastGlobalVariablesCallback(0)]))


def uneven_steps():
    m = model()
    x, y = data(32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()
    rejected(lambda: m.fit(ds, steps_per_epoch=3 + kd.rank(), epochs=1, verbose=0))


main({"stop": stop, "uneven": uneven, "uneven-steps": uneven_steps}[MODE])
