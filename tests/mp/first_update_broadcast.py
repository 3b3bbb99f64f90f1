"""DistributedOptimizer without any broadcast still ends with identical
replicas: its first update broadcasts rank 0's state. Different seeds per
rank, so the starting weights differ."""

import keras
import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def weights_everywhere(model):
    return kd.allgather_object([w.numpy() for w in model.trainable_variables])


def assert_identical(everyone):
    for other in everyone[1:]:
        for a, b in zip(other, everyone[0]):
            np.testing.assert_array_equal(a, b)


def make_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1)])


def run():
    r = kd.rank()
    keras.utils.set_random_seed(1000 + r)
    x = np.random.RandomState(r).rand(64, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    # fit(), compiled step, Adam (optimizer state), no callback at all.
    model = make_model()
    start = weights_everywhere(model)
    assert not np.array_equal(start[0][0], start[1][0])  # they do differ
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert_identical(weights_everywhere(model))
    log("fit replicas identical")

    # A model built by its first call, inside the compiled step.
    model = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert_identical(weights_everywhere(model))
    log("unbuilt model replicas identical")

    # A custom loop: apply_gradients inside a tf.function.
    model = make_model()
    opt = kd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for i in range(4):
        step(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16])
    assert_identical(weights_everywhere(model))
    assert_identical(kd.allgather_object([v.numpy() for v in opt.variables]))
    log("custom loop replicas identical")

    # With the callback, the first update broadcasts nothing more: rank 1's
    # later own changes to a weight are not overwritten by a late broadcast.
    model = make_model()
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[kd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert_identical(weights_everywhere(model))
    log("callback replicas identical")


main(run)
