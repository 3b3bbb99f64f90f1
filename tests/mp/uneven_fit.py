"""model.fit with uneven per-rank data: unknown lengths join and finish with
identical weights; known, different lengths fail before the first step."""

import sys

import keras
import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    m.compile(kd.DistributedOptimizer(keras.optimizers.SGD(0.05)), "mse")
    return m


def dataset(r, known):
    n = 16 * (r + 1) + 8 * r  # rank r: 2 + 3r batches of 8
    x = np.random.RandomState(r).rand(n, 4).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True)))
    if not known:  # a filter hides the cardinality, as real pipelines often do
        ds = ds.filter(lambda a, b: True)
    return ds.batch(8)


def run():
    r = kd.rank()
    known = sys.argv[1] == "known"
    m = model()
    callbacks = [kd.callbacks.UnevenDataCallback(),
                 kd.callbacks.BroadcastGlobalVariablesCallback(0),
                 kd.callbacks.MetricAverageCallback()]
    if known:
        try:
            m.fit(dataset(r, True), epochs=1, verbose=0, callbacks=callbacks)
        except ValueError as e:
            assert "different numbers of steps" in str(e) and "rank 1:" in str(e), e
            log("uneven known lengths rejected")
            return
        raise AssertionError("uneven known lengths were not rejected")
    m.fit(dataset(r, False), epochs=2, verbose=0, callbacks=callbacks)
    w = np.concatenate([v.numpy().ravel() for v in m.weights])
    everyone = kd.allgather_object(w)
    assert all(np.array_equal(everyone[0], o) for o in everyone), "weights differ"
    assert callbacks[0].last_joined == kd.size() - 1, callbacks[0].last_joined
    log("uneven unknown lengths finished with identical weights")


main(run)
