"""Shared pieces of the cb_*.py callback scripts (imported, not run)."""

import keras
import numpy as np

import kerasdist as kd


class Recorder(keras.callbacks.Callback):
    """Records LRs before each batch, batch and epoch counts, and logs."""

    def __init__(self):
        super().__init__()
        self.lrs, self.logs, self.batches, self.epochs = [], [], 0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs += 1

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate))

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


def make_model(lr=0.05, seed=0, run_eagerly=True, distributed=False):
    """A tiny compiled model; eager steps by default (tracing dominates)."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(lr)
    if distributed:
        optimizer = kd.DistributedOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"],
                  run_eagerly=run_eagerly)
    return model


def data(n, seed):
    rng = np.random.default_rng(seed)
    return rng.random((n, 3), np.float32), rng.random((n, 1), np.float32) * (seed + 1)
