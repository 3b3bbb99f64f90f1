"""Elastic state across a job restart (run by kerasdist-run --max-restarts 1).

3 epochs of 5 batches at np=2. On the first attempt (unless KD_NO_CRASH),
rank 1 SIGKILLs itself before batch 3 of epoch 1; the restarted job
continues from the last commit (epoch 1, 3 batches done). Rank 0 logs each
trained batch with the attempt; every rank writes its final weights."""

import hashlib
import json
import os
import signal
import sys

import keras
import numpy as np
import tensorflow as tf

import kerasdist as kd

EPOCHS, STEPS, BATCH = 3, 5, 4
OUT = sys.argv[1]
ATTEMPT = int(os.environ.get("KERASDIST_RESTART", "0") or 0)


def epoch_data(epoch, rank):
    rng = np.random.RandomState(1000 * epoch + rank)
    x = rng.rand(STEPS * BATCH, 3).astype("float32")
    return x, x @ np.array([[1.0], [-2.0], [0.5]], "float32")


class Log(keras.callbacks.Callback):
    _kerasdist_never_stops = True

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_begin(self, batch, logs=None):
        done = int(self.state.batch)
        if (not os.environ.get("KD_NO_CRASH") and ATTEMPT == 0 and kd.rank() == 1
                and (self.state.epoch, done) == (1, 3)):
            os.kill(os.getpid(), signal.SIGKILL)
        if kd.rank() == 0:
            with open(os.path.join(OUT, "batches.log"), "a") as f:
                f.write(json.dumps([ATTEMPT, int(self.state.epoch), done]) + "\n")


def main():
    kd.init()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
                  loss="mse")
    state = kd.elastic.KerasState(model, batch=0, epoch=0,
                                  checkpoint_dir=os.path.join(OUT, "elastic"))
    resets = []
    state.register_reset_callbacks([lambda: resets.append(kd.size())])

    @kd.elastic.run
    def train(state):
        if kd.rank() == 0:
            with open(os.path.join(OUT, "starts.log"), "a") as f:
                f.write(json.dumps([ATTEMPT, state.epoch, state.batch, resets]) + "\n")
        for epoch in range(state.epoch, EPOCHS):
            start = int(state.batch)
            x, y = epoch_data(epoch, kd.rank())
            model.fit(x[start * BATCH:], y[start * BATCH:], batch_size=BATCH,
                      shuffle=False, initial_epoch=epoch, epochs=epoch + 1, verbose=0,
                      callbacks=[Log(state),
                                 kd.elastic.UpdateEpochStateCallback(state),
                                 kd.elastic.UpdateBatchStateCallback(state),
                                 kd.elastic.CommitStateCallback(state)])

    train(state)
    weights = b"".join(w.numpy().tobytes() for w in model.weights)
    name = "weights.ref" if os.environ.get("KD_NO_CRASH") else "weights"
    with open(os.path.join(OUT, f"{name}.{kd.rank()}"), "w") as f:
        f.write(hashlib.sha256(weights).hexdigest())
    assert (state.epoch, state.batch) == (EPOCHS, 0), (state.epoch, state.batch)


main()
