"""DistributedOptimizer with model.fit, custom loops, gradient accumulation
and mixed precision: replicas stay bit-identical; a plain control diverges."""

import sys

import keras
import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def flat(variables):
    return np.concatenate([np.asarray(v.numpy(), np.float64).ravel() for v in variables])


def identical(values, what):
    everyone = kd.allgather_object(values)
    same = all(np.array_equal(everyone[0], v) for v in everyone[1:])
    assert same, f"{what} differ across ranks"


def differ(values, what):
    everyone = kd.allgather_object(values)
    assert not np.array_equal(everyone[0], everyone[1]), f"{what} unexpectedly identical"


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(1),
    ])


def data(r, n=64):
    rng = np.random.RandomState(100 + r)
    x = rng.rand(n, 8).astype("float32")
    return x, (x.sum(1, keepdims=True) + rng.rand(n, 1)).astype("float32")


def check_fit(r):
    x, y = data(r)
    # Control: plain Adam, each rank on its own data and seed -> diverges.
    control = make_model(r)
    control.compile(keras.optimizers.Adam(1e-2), "mse")
    control.fit(x, y, batch_size=16, epochs=2, verbose=0)
    differ(flat(control.weights), "control weights")
    # Distributed: different seeds on purpose; the callback syncs them.
    model = make_model(r)
    model.compile(kd.DistributedOptimizer(keras.optimizers.Adam(1e-2)), "mse")
    before = flat(model.weights)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[kd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert not np.array_equal(before, flat(model.weights)), "model did not train"
    identical(flat(model.weights), "weights after fit")
    identical(flat(model.optimizer.variables), "optimizer state after fit")


def check_first_step(r):
    x, y = data(r, 16)
    model = make_model(r)
    model.compile(kd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), "mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[kd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert int(model.optimizer.iterations) == 1
    identical(flat(model.optimizer.variables), "optimizer state after step 1")
    identical(flat(model.weights), "weights after step 1")


def check_custom_loop(r, accumulation):
    x, y = data(r, 32)
    model = make_model(r)
    kwargs = {"gradient_accumulation_steps": 2} if accumulation else {}
    opt = kd.DistributedOptimizer(keras.optimizers.RMSprop(1e-2, **kwargs))
    opt.build(model.trainable_variables)
    kd.broadcast_variables(model.variables + opt.variables, root_rank=0)
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        return loss

    for i in range(4):
        step(x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8])
    identical(flat(model.weights), f"custom-loop weights (accumulation={accumulation})")


def check_mixed_precision(r):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = data(r, 48)
        if r == 1:
            x[16:32] = np.inf  # second batch: non-finite gradients on rank 1 only
        model = make_model(r)
        opt = kd.DistributedOptimizer(keras.optimizers.Adam(1e-3))
        assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
        model.compile(opt, "mse")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False,
                  callbacks=[kd.callbacks.BroadcastGlobalVariablesCallback(0)])
        scale = float(model.optimizer.dynamic_scale)
        identical(np.array([scale]), "loss scale")
        assert scale < 32768.0, f"the non-finite step was not skipped (scale {scale})"
        identical(flat(model.weights), "mixed-precision weights")
        assert np.all(np.isfinite(flat(model.weights)))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def check_save(r, path):
    model = make_model(0)
    model.compile(kd.DistributedOptimizer(keras.optimizers.Adam(1e-3)), "mse")
    x, y = data(r, 16)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    if r == 0:
        model.save(path)


def run():
    r = kd.rank()
    check_fit(r)
    log("fit ok")
    check_first_step(r)
    log("first step ok")
    check_custom_loop(r, accumulation=False)
    check_custom_loop(r, accumulation=True)
    log("custom loops ok")
    check_mixed_precision(r)
    log("mixed precision ok")
    check_save(r, sys.argv[1])


main(run)
