"""kerasdist.elastic.TensorFlowState, eagerly and in a tf.compat.v1 graph
with a session: sync gives every rank rank 0's variables and attributes;
restore returns to the last sync or commit; commit keeps the values and
rank 0 writes them to disk. Horovod's test_elastic_state, against numpy."""

import os
import pickle

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main

TMP = os.environ["KD_PARITY_TMP"]


def weights(v):
    return [np.full([2, 2], v), np.full([2], v)]


def scenario(state, read, assign, r, tag):
    state.sync()
    for w in read():  # rank 0's values everywhere
        np.testing.assert_array_equal(w, np.ones_like(w))
    assert (state.batch, state.epoch) == (20, 10), (state.batch, state.epoch)
    other = [np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([0.0, -1.0])]
    assign(other)
    state.batch, state.epoch = 21, 11
    state.restore()  # back to the sync
    for w in read():
        np.testing.assert_array_equal(w, np.ones_like(w))
    assert (state.batch, state.epoch) == (20, 10)
    assign(other)
    state.batch, state.epoch = 21, 11
    state.commit()
    assign(weights(5.0))
    state.batch = 99
    state.restore()  # back to the commit
    for w, want in zip(read(), other):
        np.testing.assert_array_equal(w, want)
    assert (state.batch, state.epoch) == (21, 11)
    if r == 0:
        with open(state.checkpoint_path, "rb") as f:
            saved = pickle.load(f)["state"]
        for w, want in zip(saved["variables"], other):
            np.testing.assert_array_equal(w, want)
        assert saved["attrs"] == {"batch": 21, "epoch": 11}, saved["attrs"]
    log(tag, "scenario passed")


def check_eager(r):
    vs = [tf.Variable(w) for w in weights(1.0 if r == 0 else 2.0)]
    state = kd.elastic.TensorFlowState(vs, batch=20 + r, epoch=10 + r,
                                       checkpoint_dir=os.path.join(TMP, "eager"))
    assert state.variables == vs

    def assign(values):
        for v, x in zip(vs, values):
            v.assign(x)

    scenario(state, lambda: [v.numpy() for v in vs], assign, r, "eager")


def check_graph(r):
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
        vs = [tf.Variable(w) for w in weights(1.0 if r == 0 else 2.0)]
        sess.run(tf.compat.v1.global_variables_initializer())
        # variables=None: the graph's global variables, as in Horovod.
        state = kd.elastic.TensorFlowState(session=sess, batch=20 + r, epoch=10 + r,
                                           checkpoint_dir=os.path.join(TMP, "graph"))
        assert state.variables == vs and state.session is sess

        def assign(values):
            for v, x in zip(vs, values):
                v.load(x, sess)

        scenario(state, lambda: sess.run(vs), assign, r, "graph")
    with tf.compat.v1.Graph().as_default():
        try:
            kd.elastic.TensorFlowState([tf.Variable(1.0)])
            raise AssertionError("expected ValueError")
        except ValueError as e:
            assert "Invalid value for argument `session`" in str(e), e


def run():
    r = kd.rank()
    for check in (check_eager, check_graph):
        check(r)
        log(check.__name__, "passed")


main(run)
