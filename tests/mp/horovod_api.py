"""Horovod API semantics at np=2 and np=3, each checked against numpy values."""

import os
import warnings

import keras
import numpy as np
import tensorflow as tf

import kerasdist as kd
import kerasdist.keras as hvdk
from _util import log, main


def check_sparse_predivide(size, r):
    # Every rank: loss = (r + 1) * sum(emb[1]); the averaged gradient of row 1
    # is mean(r + 1) = (size + 1) / 2, so one SGD step (lr=1) moves it by that.
    for factor in (1.0, 2.0):
        emb = keras.layers.Embedding(4, 2, embeddings_initializer="zeros")
        emb.build((None,))
        opt = kd.DistributedOptimizer(keras.optimizers.SGD(1.0),
                                      gradient_predivide_factor=factor)
        with tf.GradientTape() as tape:
            loss = (r + 1) * tf.reduce_sum(emb(tf.constant([1])))
        grads = tape.gradient(loss, emb.trainable_variables)
        assert isinstance(grads[0], tf.IndexedSlices)
        opt.apply_gradients(zip(grads, emb.trainable_variables))
        want = np.zeros([4, 2], np.float32)
        want[1] = -(size + 1) / 2.0
        np.testing.assert_allclose(emb.embeddings.numpy(), want, rtol=1e-6)
    s = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([r]), tf.constant([size, 2]))
    for op in (kd.Min, kd.Max, kd.Product):
        try:
            kd.allreduce(s, op=op)
            raise AssertionError("expected NotImplementedError")
        except NotImplementedError:
            pass
    dense = kd.allreduce(s, op=kd.Sum, prescale_factor=2.0, sparse_as_dense=True)
    np.testing.assert_allclose(dense.numpy(), np.full([size, 2], 2.0))


def expect_precondition(fn, *needles):
    try:
        fn()
    except tf.errors.FailedPreconditionError as e:
        for needle in needles:
            assert needle in str(e), (needle, str(e))
        return
    raise AssertionError("expected FailedPreconditionError")


def check_mismatch_and_objects(size, r):
    expect_precondition(lambda: kd.allreduce(tf.ones([2 + r]), name="p.shape"),
                        "'p.shape'", "[2]", "[3]")
    expect_precondition(lambda: kd.broadcast(tf.ones([2]), root_rank=r, name="p.root"),
                        "'p.root'")

    @tf.function
    def objects():
        got = kd.broadcast_object({"r": r * 10 + 7}, root_rank=size - 1)
        everyone = kd.allgather_object(("rank", r))
        return tf.constant(got["r"]) + tf.constant(len(everyone)), everyone

    value, everyone = objects()
    assert int(value) == (size - 1) * 10 + 7 + size, int(value)
    assert everyone == [("rank", k) for k in range(size)], everyone


def check_average_argument(size, r):
    x = tf.constant([float(r + 1), 2.0 * (r + 1)])
    total = sum(range(1, size + 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = kd.allreduce(x, average=False, name="avg.false")
        a = kd.allreduce(x, average=True, name="avg.true")
        g = kd.grouped_allreduce([x, x * 2], average=False, name="avg.group")
    assert sum(issubclass(w.category, DeprecationWarning) for w in caught) == 3
    np.testing.assert_allclose(s.numpy(), [total, 2 * total])
    np.testing.assert_allclose(a.numpy(), [total / size, 2 * total / size])
    np.testing.assert_allclose(g[1].numpy(), [2 * total, 4 * total])
    try:
        kd.allreduce(x, op=kd.Sum, average=True)
        raise AssertionError("expected ValueError")
    except ValueError:
        pass


def check_queries(size, r):
    @tf.function
    def ids():
        return tf.stack([kd.rank_op(), kd.local_rank_op(), kd.size_op(),
                         kd.local_size_op(), kd.process_set_included_op()])

    np.testing.assert_array_equal(
        ids().numpy(), [r, kd.local_rank(), size, kd.local_size(), 1])
    assert kd.is_homogeneous() is True and kd.mpi_threads_supported() is True
    assert kd.mpi_built() and kd.mpi_enabled() and not kd.gloo_built()


def _variables(r):
    a = tf.Variable([1.0, 2.0, 3.0])
    b = tf.Variable([[1.0], [1.0]])
    c = tf.Variable(4.0)
    return [a, b, c]


def check_tape(size, r):
    mean_coef = (size + 1) / 2.0  # mean over ranks of (r + 1)
    for kwargs in ({}, {"groups": 2}, {"groups": "list"}, {"num_groups": 3},
                   {"gradient_predivide_factor": 2.0}, {"op": kd.Sum}):
        a, b, c = _variables(r)
        if kwargs.get("groups") == "list":
            kwargs = {"groups": [[a, c]]}

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = (r + 1) * (tf.reduce_sum(a * a) + tf.reduce_sum(b) + 3.0 * c)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                tape = kd.DistributedGradientTape(tape, **kwargs)
            return tape.gradient(loss, [a, b, c])

        ga, gb, gc = step()
        k = mean_coef * size if kwargs.get("op") == kd.Sum else mean_coef
        np.testing.assert_allclose(ga.numpy(), k * 2 * np.array([1.0, 2.0, 3.0]), rtol=1e-6)
        np.testing.assert_allclose(gb.numpy(), np.full([2, 1], k), rtol=1e-6)
        np.testing.assert_allclose(gc.numpy(), 3.0 * k, rtol=1e-6)
    # Wrapped before recording, eager, a sparse gradient, a nested source.
    emb = keras.layers.Embedding(3, 2, embeddings_initializer="ones")
    emb.build((None,))
    with kd.DistributedGradientTape(tf.GradientTape()) as tape:
        loss = (r + 1) * tf.reduce_sum(emb(tf.constant([2])))
    (g,) = tape.gradient(loss, {"e": emb.embeddings}).values()
    dense = tf.math.unsorted_segment_sum(g.values, g.indices, 3).numpy()
    np.testing.assert_allclose(dense, [[0, 0], [0, 0], [mean_coef, mean_coef]])
    # Partial: the local layer's gradient is this rank's, divided by size.
    shared = keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)
    local = keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)
    x = tf.ones([1, 2])
    with tf.GradientTape() as tape:
        loss = (r + 1) * tf.reduce_sum(local(shared(x)))
    tape = kd.PartialDistributedGradientTape(tape, local_layers=[local])
    gs, gl = tape.gradient(loss, [shared.kernel, local.kernel])
    np.testing.assert_allclose(gs.numpy(), np.full([2, 1], mean_coef))
    np.testing.assert_allclose(gl.numpy(), np.full([1, 1], 2.0 * (r + 1) / size))


def check_partial_optimizer(size, r):
    keras.utils.set_random_seed(r)  # different starting weights on purpose
    inputs = keras.Input((3,))
    head = keras.layers.Dense(2, name="head")
    model = keras.Model(inputs, head(keras.layers.Dense(4, name="body")(inputs)))
    opt = kd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[head])
    model.compile(optimizer=opt, loss="mse")
    x = np.random.RandomState(r).rand(8, 3).astype("float32")
    y = np.random.RandomState(10 + r).rand(8, 2).astype("float32")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[
        kd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=head.weights)])
    body = np.concatenate([w.numpy().ravel() for w in model.get_layer("body").weights])
    local = np.concatenate([w.numpy().ravel() for w in head.weights])
    bodies = kd.allgather_object(body)
    heads = kd.allgather_object(local)
    for k in range(size):
        np.testing.assert_array_equal(bodies[k], bodies[0])
    assert all(not np.array_equal(heads[k], heads[0]) for k in range(1, size))


def check_keras_module(size, r, tmp):
    out = hvdk.allreduce(np.array([r + 1.0, 1.0]), op=hvdk.Sum, name="k.sum")
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, [sum(range(1, size + 1)), size])
    gathered = hvdk.allgather(np.full([r + 1, 2], r, np.int32), name="k.gather")
    assert isinstance(gathered, np.ndarray) and gathered.shape == (size * (size + 1) // 2, 2)
    np.testing.assert_array_equal(hvdk.broadcast(np.array([r, r]), 1, name="k.bc"), [1, 1])
    # broadcast_global_variables before the first update: rank 1's weights win.
    keras.utils.set_random_seed(100 + r)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    start = model.get_weights()
    hvdk.broadcast_global_variables(1)
    model.fit(np.ones([2, 2]), np.ones([2, 1]), batch_size=2, verbose=0)
    rank1 = hvdk.broadcast_object(start, root_rank=1)
    for w, want in zip(model.get_weights(), rank1):
        np.testing.assert_array_equal(w, want)
    # load_model with Horovod's signature; BestModelCheckpoint on rank 0.
    path = os.path.join(tmp, "best.keras")
    model.fit(np.ones([4, 2]), np.ones([4, 1]), batch_size=2, epochs=2, verbose=0,
              validation_data=(np.ones([2, 2]), np.zeros([2, 1])),
              callbacks=[hvdk.callbacks.BestModelCheckpoint(filepath=path)])
    kd.barrier()
    loaded = hvdk.load_model(path, custom_optimizers=[keras.optimizers.SGD])
    assert getattr(loaded.optimizer, "_kerasdist_distributed", False)


def check_sync_batch_norm(size, r):
    per_rank, channels = 3, 4
    rng = np.random.RandomState(7)
    full = (rng.randn(size * per_rank, 5, channels) * 3 + 2).astype("float32")
    mine = full[r * per_rank:(r + 1) * per_rank]
    sync = kd.SyncBatchNormalization(momentum=0.5)
    plain = keras.layers.BatchNormalization(momentum=0.5)
    for _ in range(2):
        got = sync(mine, training=True).numpy()
        want = plain(full, training=True).numpy()[r * per_rank:(r + 1) * per_rank]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(sync.moving_mean.numpy(), plain.moving_mean.numpy(), rtol=1e-5)
    np.testing.assert_allclose(sync.moving_variance.numpy(),
                               plain.moving_variance.numpy(), rtol=1e-5)
    np.testing.assert_allclose(sync(mine, training=False).numpy(),
                               plain(mine, training=False).numpy(), rtol=1e-5, atol=1e-5)


def run():
    size, r = kd.size(), kd.rank()
    tmp = kd.broadcast_object(os.environ.get("KD_TEST_TMP", "/tmp"))
    for check in (check_sparse_predivide, check_mismatch_and_objects,
                  check_average_argument, check_queries, check_tape,
                  check_partial_optimizer, check_sync_batch_norm):
        check(size, r)
        log(check.__name__, "passed")
    check_keras_module(size, r, tmp)
    log("check_keras_module passed")


main(run)
