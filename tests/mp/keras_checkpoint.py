"""Rank-0 checkpointing: ModelCheckpoint and BackupAndRestore, with kills.

argv: mode directory, where mode is one of
  ckpt         ModelCheckpoint each epoch; non-root ranks must never save
  ckpt-kill    like ckpt, but rank 0 is killed inside the epoch-2 save
  backup-kill  BackupAndRestore; every rank dies after epoch 2
  backup-run   rerun: must resume at epoch 3 with identical weights
"""

import os
import signal
import sys

import keras
import numpy as np

import kerasdist as kd
from _util import log, main

MODE, DIRECTORY = sys.argv[1], sys.argv[2]


def model_and_data(r):
    keras.utils.set_random_seed(r)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(kd.DistributedOptimizer(keras.optimizers.Adam(1e-2)), "mse")
    rng = np.random.RandomState(r)
    x = rng.rand(32, 4).astype("float32")
    return model, x, x.sum(1, keepdims=True)


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


class DieAfterEpoch(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            log("dying after epoch", epoch + 1)
            os.kill(os.getpid(), signal.SIGKILL)


def run():
    r = kd.rank()
    model, x, y = model_and_data(r)
    sync = kd.callbacks.BroadcastGlobalVariablesCallback(0)
    if MODE.startswith("ckpt"):
        path = os.path.join(DIRECTORY, "model.keras")
        original_save = keras.Model.save

        def guarded_save(self, filepath, *args, **kwargs):
            assert r == 0, f"rank {r} tried to save {filepath}"
            if MODE == "ckpt-kill" and os.path.exists(path):
                original_save(self, filepath, *args, **kwargs)
                with open(filepath, "r+b") as f:  # half-written temporary file
                    f.truncate(os.path.getsize(filepath) // 2)
                os.kill(os.getpid(), signal.SIGKILL)
            return original_save(self, filepath, *args, **kwargs)

        keras.Model.save = guarded_save
        ckpt = kd.callbacks.ModelCheckpoint(path, monitor="loss", save_best_only=False)
        model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[sync, ckpt])
        return
    rec = Recorder()
    backup = kd.callbacks.BackupAndRestore(DIRECTORY)
    callbacks = [sync, backup, rec]
    if MODE == "backup-kill":
        callbacks.append(DieAfterEpoch(1))
    model.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=callbacks)
    assert rec.epochs == [2, 3], f"resumed at the wrong epoch: ran {rec.epochs}"
    weights = np.concatenate([v.numpy().ravel() for v in model.weights])
    everyone = kd.allgather_object(weights)
    assert all(np.array_equal(everyone[0], w) for w in everyone), "weights differ"
    assert not os.path.exists(os.path.join(DIRECTORY, "state.npz")), "backup not deleted"
    log("resumed at epoch 3 with identical weights")


main(run)
