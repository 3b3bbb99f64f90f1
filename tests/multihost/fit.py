"""`model.fit` with kerasdist's callbacks across hosts: replicas end
bit-identical, averaged metrics agree, the warmup reaches its target rate.

Each rank starts from a different seed and trains on its own data, so only
the broadcast and the gradient allreduce can make the replicas agree. A
plain (non-distributed) control run diverges, which shows the check can
fail.
"""

import keras
import numpy as np

import kerasdist as kd
from _util import log, main


def flat(variables):
    return np.concatenate([np.asarray(v.numpy(), np.float64).ravel() for v in variables])


def gather_equal(value):
    everyone = kd.allgather_object(value)
    return all(np.array_equal(everyone[0], v) for v in everyone[1:]), everyone


def make_model(seed, optimizer):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(12, activation="tanh"),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer, "mse", metrics=["mae"])
    return model


def data(r, n=96):
    rng = np.random.RandomState(500 + r)
    x = rng.rand(n, 6).astype("float32")
    return x, (x @ np.arange(1, 7, dtype="float32")[:, None]
               + rng.rand(n, 1).astype("float32"))


def run():
    r = kd.rank()
    x, y = data(r)
    control = make_model(r, keras.optimizers.Adam(1e-2))
    control.fit(x, y, batch_size=16, epochs=1, verbose=0)
    same, _ = gather_equal(flat(control.weights))
    assert not same, "control replicas unexpectedly identical"

    lr = kd.scale_learning_rate(0.005)
    model = make_model(r, kd.DistributedOptimizer(keras.optimizers.Adam(lr)))
    before = flat(model.weights)
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=True, callbacks=[
        kd.callbacks.BroadcastGlobalVariablesCallback(0),
        kd.callbacks.MetricAverageCallback(),
        kd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=1),
    ])
    assert not np.array_equal(before, flat(model.weights)), "model did not train"
    same, _ = gather_equal(flat(model.weights))
    assert same, "weights differ across ranks after fit"
    same, _ = gather_equal(flat(model.optimizer.variables))
    assert same, "optimizer state differs across ranks after fit"
    assert int(model.optimizer.iterations) == 3 * 6, int(model.optimizer.iterations)
    got_lr = float(model.optimizer.learning_rate)
    np.testing.assert_allclose(got_lr, lr, rtol=1e-6)
    metrics = np.array([history.history[k][-1] for k in sorted(history.history)])
    same, everyone = gather_equal(metrics)
    assert same, f"averaged metrics differ across ranks: {everyone}"
    log("fit replicas identical; final loss", history.history["loss"][-1])


main(run)
