"""Rank-side helper for tests/test_restarts.py: `fit` that crashes once.

Usage: restart_fit.py DIR. A 3-epoch `model.fit` of a tiny model with
kerasdist's DistributedOptimizer, BroadcastGlobalVariablesCallback and
BackupAndRestore (backup in DIR/backup). On the first attempt only (no
DIR/crashed yet) rank 1 kills itself with SIGKILL in epoch 2. Rank 0
appends one JSON line per finished epoch to DIR/epochs.log; at the end every
rank writes the SHA-256 of its weights to DIR/weights.<rank> and rank 0
writes the final history to DIR/history.json.
"""

import hashlib
import json
import os
import signal
import sys

import keras
import numpy as np

import kerasdist as kd

out = sys.argv[1]
kd.init()
rank, attempt = kd.rank(), int(os.environ.get("KERASDIST_RESTART", "0"))
keras.utils.set_random_seed(rank)  # Different starting weights per rank.
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32"))[:, None]
x, y = x[rank::kd.size()], y[rank::kd.size()]
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")


class Crash(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        marker = os.path.join(out, "crashed")
        if self.epoch == 1 and batch == 2 and rank == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            print("rank 1: killing myself in epoch 2", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_end(self, epoch, logs=None):
        if rank == 0:
            with open(os.path.join(out, "epochs.log"), "a") as f:
                f.write(json.dumps({"epoch": epoch, "attempt": attempt}) + "\n")


history = model.fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False, callbacks=[
    kd.callbacks.BroadcastGlobalVariablesCallback(0),
    kd.callbacks.BackupAndRestore(os.path.join(out, "backup")), Crash()])
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
with open(os.path.join(out, f"weights.{rank}"), "w") as f:
    f.write(digest)
if rank == 0:
    with open(os.path.join(out, "history.json"), "w") as f:
        json.dump({"epoch": history.epoch, "attempt": attempt}, f)
