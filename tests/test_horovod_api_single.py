"""Horovod's API names and semantics at size 1 under plain pytest."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasdist as kd
import kerasdist.keras as hvdk


@pytest.fixture(autouse=True)
def initialized():
    kd.init()
    yield


def test_query_ops_read_the_context_at_run_time():
    @tf.function
    def ids():
        return tf.stack([kd.rank_op(), kd.local_rank_op(), kd.size_op(),
                         kd.local_size_op(), kd.process_set_included_op()])

    np.testing.assert_array_equal(ids().numpy(), [0, 0, 1, 1, 1])
    kd.shutdown()
    with pytest.raises(tf.errors.FailedPreconditionError, match="not initialized"):
        ids()
    kd.init()
    np.testing.assert_array_equal(ids().numpy(), [0, 0, 1, 1, 1])
    with pytest.raises(ValueError, match="registered process set"):
        kd.size_op(process_set_id=1)


def test_build_queries_are_truthful():
    assert kd.is_homogeneous() is True
    assert kd.mpi_threads_supported() is True
    assert kd.mpi_built() is True and kd.mpi_enabled() is True
    assert (kd.gloo_built(), kd.gloo_enabled(), kd.nccl_built(), kd.ccl_built(),
            kd.cuda_built(), kd.rocm_built(), kd.ddl_built()) == (
                False, False, 0, False, False, False, False)


def test_timeline_cannot_start_or_stop_at_run_time(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="KERASDIST_TIMELINE=.* before `kerasdist.init"):
        kd.start_timeline(str(tmp_path / "t.json"))
    kd.stop_timeline()  # nothing is being written: nothing to stop
    kd.shutdown()
    path = str(tmp_path / "t.json")
    monkeypatch.setenv("KERASDIST_TIMELINE", path)
    kd.init()
    try:
        kd.start_timeline(path)  # already writing there
        with pytest.raises(RuntimeError, match="shutdown"):
            kd.stop_timeline()
    finally:
        kd.shutdown()
        monkeypatch.delenv("KERASDIST_TIMELINE")
        kd.init()


def test_sparse_restrictions_and_dense_scaling():
    s = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1]), tf.constant([2, 2]))
    for op in (kd.Min, kd.Max, kd.Product):
        with pytest.raises(NotImplementedError, match="Average and op=kerasdist.Sum"):
            kd.allreduce(s, op=op)
    with pytest.raises(NotImplementedError, match="prescale_factor"):
        kd.allreduce(s, postscale_factor=3.0)
    dense = kd.allreduce(s, op=kd.Sum, postscale_factor=3.0, sparse_as_dense=True)
    np.testing.assert_allclose(dense.numpy(), [[0, 0], [3, 3]])


def test_average_argument_is_deprecated_and_mapped():
    x = tf.constant([2.0, 4.0])
    with pytest.warns(DeprecationWarning, match="`average`"):
        np.testing.assert_allclose(kd.allreduce(x, average=False).numpy(), [2, 4])
    with pytest.warns(DeprecationWarning):
        kd.grouped_allreduce([x], average=True)
    with pytest.raises(ValueError, match="not both"):
        kd.allreduce(x, op=kd.Sum, average=False)


def test_gradient_tape_wraps_before_or_after_recording():
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w)
    dtape = kd.DistributedGradientTape(tape, groups=1)
    assert isinstance(dtape, tf.GradientTape)
    np.testing.assert_allclose(dtape.gradient(loss, [w])[0].numpy(), [2.0, 4.0])
    with kd.DistributedGradientTape(tf.GradientTape(persistent=True)) as t2:
        loss = tf.reduce_sum(3.0 * w)
    assert t2.gradient(loss, {"w": w})["w"].numpy().tolist() == [3.0, 3.0]
    assert t2.gradient(loss, w).numpy().tolist() == [3.0, 3.0]  # persistent kept
    with pytest.raises(ValueError, match="`groups`"):
        kd.DistributedGradientTape(tf.GradientTape(), groups="two")
    with pytest.raises(ValueError, match="requires op=kerasdist.Average"):
        kd.DistributedGradientTape(tf.GradientTape(), op=kd.Sum,
                                   gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="`gradtape`"):
        kd.DistributedGradientTape(object())


def test_keras_module_values_are_numpy():
    out = hvdk.allreduce(np.array([1.0, 2.0]), op=hvdk.Sum)
    assert isinstance(out, np.ndarray) and out.tolist() == [1.0, 2.0]
    assert isinstance(hvdk.allgather(np.ones([2, 1])), np.ndarray)
    assert hvdk.broadcast(np.array([5]), 0).tolist() == [5]
    hvdk.broadcast_global_variables(0)
    assert hvdk.reducescatter(np.array([[1.0], [2.0]]), op=hvdk.Sum).tolist() == [[1.0], [2.0]]
    assert hvdk.DistributedOptimizer is kd.DistributedOptimizer


def test_best_model_checkpoint_and_load_model(tmp_path):
    with pytest.raises(ValueError, match="`filepath`"):
        hvdk.callbacks.BestModelCheckpoint()
    path = str(tmp_path / "best.keras")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    cb = hvdk.callbacks.BestModelCheckpoint(monitor="loss", filepath=path)
    model.fit(np.ones([4, 2]), np.ones([4, 1]), epochs=2, verbose=0, callbacks=[cb])
    loaded = hvdk.load_model(path, custom_optimizers=[keras.optimizers.SGD])
    assert getattr(loaded.optimizer, "_kerasdist_distributed", False)
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_sync_batch_norm_is_batch_norm_at_size_one():
    x = np.random.RandomState(0).randn(6, 3).astype("float32")
    sync, plain = kd.SyncBatchNormalization(), keras.layers.BatchNormalization()
    np.testing.assert_allclose(sync(x, training=True).numpy(),
                               plain(x, training=True).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sync.moving_variance.numpy(),
                               plain.moving_variance.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="`renorm`"):
        kd.SyncBatchNormalization(renorm=True)
    config = sync.get_config()
    assert keras.layers.deserialize(keras.layers.serialize(sync)).get_config() == config


def test_sync_batch_norm_takes_horovods_fused_argument():
    x = np.random.RandomState(1).randn(5, 2).astype("float32")
    sync = kd.SyncBatchNormalization(fused=False, axis=1)
    plain = keras.layers.BatchNormalization(axis=1)
    np.testing.assert_allclose(sync(x, training=True).numpy(),
                               plain(x, training=True).numpy(), rtol=1e-5, atol=1e-5)
    assert "fused" not in sync.get_config()
    for fused in (True, None):
        with pytest.raises(ValueError, match=f"Received: fused={fused}"):
            kd.SyncBatchNormalization(fused=fused)


def test_broadcast_object_inside_tf_function():
    @tf.function
    def f():
        return tf.constant(kd.broadcast_object(7)) + len(kd.allgather_object("x"))

    assert int(f()) == 8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kd.allreduce(tf.ones([1]))  # op=None means Average, no warning


def _elastic_model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
                  loss="mse")
    return model


def test_elastic_commit_restore_and_restart_from_disk(tmp_path, monkeypatch):
    model = _elastic_model()
    state = kd.elastic.KerasState(model, batch=0, epoch=0, checkpoint_dir=tmp_path)
    state.batch, state.epoch = 3, 1
    state.commit()
    committed = [w.numpy().copy() for w in model.weights]
    assert (tmp_path / "state.pkl").exists()
    model.fit(np.ones([4, 2]), np.ones([4, 1]), verbose=0)
    state.batch = 9
    state.restore()
    assert (state.batch, state.epoch) == (3, 1)
    for w, c in zip(model.weights, committed):
        np.testing.assert_array_equal(w.numpy(), c)
    # A restarted job: `run` reads the commit from disk before calling.
    model2 = _elastic_model()
    state2 = kd.elastic.KerasState(model2, batch=0, epoch=0, checkpoint_dir=tmp_path)
    calls = []
    state2.register_reset_callbacks([lambda: calls.append("reset")])
    monkeypatch.setenv("KERASDIST_RESTART", "1")
    seen = kd.elastic.run(lambda s: (s.epoch, s.batch))(state2)
    assert seen == (1, 3) and calls == ["reset"]
    for w, c in zip(model2.weights, committed):
        np.testing.assert_array_equal(w.numpy(), c)
    # Not a restart: the commit on disk is ignored.
    monkeypatch.delenv("KERASDIST_RESTART")
    state3 = kd.elastic.KerasState(_elastic_model(), batch=0, epoch=0,
                                   checkpoint_dir=tmp_path)
    assert kd.elastic.run(lambda s: (s.epoch, s.batch))(state3) == (0, 0)


def test_elastic_corrupt_commit_and_callbacks(tmp_path, monkeypatch):
    (tmp_path / "state.pkl").write_bytes(b"not a pickle")
    state = kd.elastic.ObjectState(checkpoint_dir=tmp_path, epoch=0)
    monkeypatch.setenv("KERASDIST_RESTART", "2")
    with pytest.raises(RuntimeError, match="could not be restored on rank 0"):
        kd.elastic.run(lambda s: None)(state)
    monkeypatch.delenv("KERASDIST_RESTART")
    with pytest.raises(ValueError, match="`batches_per_commit`"):
        kd.elastic.CommitStateCallback(state, batches_per_commit=0)
    model = _elastic_model()
    kstate = kd.elastic.KerasState(model, batch=0, epoch=0, checkpoint_dir=tmp_path / "k")
    model.fit(np.ones([8, 2]), np.ones([8, 1]), batch_size=2, epochs=2, verbose=0,
              callbacks=[kd.elastic.UpdateEpochStateCallback(kstate),
                         kd.elastic.UpdateBatchStateCallback(kstate),
                         kd.elastic.CommitStateCallback(kstate, batches_per_commit=3)])
    assert (kstate.epoch, kstate.batch) == (2, 0)
    import pickle
    saved = pickle.loads((tmp_path / "k" / "state.pkl").read_bytes())["state"]
    assert saved["attrs"] == {"batch": 0, "epoch": 2}


def test_reducescatter_alltoall_grouped_allgather_broadcast_at_size_one():
    assert kd.reducescatter(tf.ones([3, 2]), op=kd.Sum).shape == (3, 2)
    assert kd.alltoall(tf.range(4)).numpy().tolist() == [0, 1, 2, 3]
    out, received = kd.alltoall(tf.range(4), splits=[4])
    assert out.numpy().tolist() == [0, 1, 2, 3] and received.numpy().tolist() == [4]
    assert [t.shape for t in kd.grouped_allgather([tf.ones([2]), tf.ones([0, 3])])] == [
        (2,), (0, 3)]
    v = tf.Variable([1.0, 2.0])
    assert kd.broadcast_([v], 0)[0].numpy().tolist() == [1.0, 2.0]
    for op in (kd.Min, kd.Max, kd.Product):
        with pytest.raises(ValueError, match="Expected kerasdist.Average or kerasdist.Sum"):
            kd.reducescatter(tf.ones([2]), op=op)
    with pytest.raises(ValueError, match="at least one dimension"):
        kd.reducescatter(tf.constant(1.0))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Invalid splits"):
        kd.alltoall(tf.range(4), splits=[3])  # this rank's own error, as in Horovod
    with pytest.raises(TypeError, match="integers"):
        kd.alltoall(tf.range(4), splits=[4.0])
    with pytest.raises(TypeError, match="kerasdist.ProcessSet"):
        kd.reducescatter(tf.ones([2]), process_set=type("PS", (), {"process_set_id": 1})())
    with pytest.raises(ValueError, match="not registered"):
        kd.reducescatter(tf.ones([2]), process_set=kd.ProcessSet([0]))
