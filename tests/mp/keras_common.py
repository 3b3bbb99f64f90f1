"""Checks of the Keras layer that hold on every Keras backend fed with numpy
(torch, JAX), for tests/mp/keras_torch.py and tests/mp/keras_jax.py.

Each rank trains on its share of every global batch; the results are
compared with one process training on the whole batches (float64, so that
sums agree to rounding), and the replicas must be bit-identical.
"""

import os
import sys

import keras
import numpy as np

import kerasdist as kd

keras.config.set_floatx("float64")
keras.config.set_dtype_policy("float64")
# Keras' torch backend computes some gradients at float32 precision even in
# float64 (in one process, the mean of two half-batch gradients differs
# from the whole batch's by 2**-23), so results match one process to
# float32's rounding; a reduction that is wrong is off by orders more.
TOL = dict(rtol=1e-6, atol=1e-7)
B = 4  # examples per rank per step
STEPS = 6


def flat(variables):
    return np.concatenate([np.asarray(keras.ops.convert_to_numpy(v), np.float64).ravel()
                           for v in variables])


def identical(values, what):
    everyone = kd.allgather_object(values)
    for q, v in enumerate(everyone):
        assert np.array_equal(everyone[0], v), f"{what}: rank {q} differs from rank 0"


def make_model(seed, batch_norm=False):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((5,)), keras.layers.Dense(4, activation="tanh")]
    if batch_norm:
        layers.append(kd.SyncBatchNormalization())
    layers.append(keras.layers.Dense(1))
    return keras.Sequential(layers)


def global_data(steps=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * B * kd.size(), 5))
    return x, (x @ rng.normal(size=(5, 1)) + 0.1 * rng.normal(size=(len(x), 1)))


def my_rows(array):
    """This rank's rows of every global batch of B * size() rows."""
    n, r = kd.size(), kd.rank()
    return np.concatenate([array[s * B * n + r * B: s * B * n + (r + 1) * B]
                           for s in range(len(array) // (B * n))])


def reference(make_opt, x, y, epochs=1, batch_norm=False):
    """One process, whole batches, rank 0's initial weights."""
    model = make_model(0, batch_norm)
    model.compile(optimizer=make_opt(), loss="mse")
    model.fit(x, y, batch_size=B * kd.size(), epochs=epochs, shuffle=False, verbose=0)
    return flat(model.trainable_weights)


def check_fit_matches_one_process():
    x, y = global_data()
    model = make_model(kd.rank())  # different start: the first update broadcasts rank 0's
    raw = []
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5)),
                  loss="mse")
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: raw.append(float(logs["loss"])))
    hist = model.fit(my_rows(x), my_rows(y), batch_size=B, epochs=2, shuffle=False, verbose=0,
                     callbacks=[record, kd.callbacks.MetricAverageCallback()])
    mine = flat(model.trainable_weights)
    identical(mine, "weights after fit")
    want = reference(lambda: keras.optimizers.SGD(0.05, momentum=0.5), x, y, epochs=2)
    np.testing.assert_allclose(mine, want, **TOL)
    # The logged loss is the ranks' average of their own losses.
    everyone = kd.allgather_object(raw)
    np.testing.assert_allclose(hist.history["loss"], np.mean(everyone, axis=0), rtol=1e-12)
    assert "tensorflow" not in sys.modules


def check_accumulation_and_loss_scaling():
    x, y = global_data(seed=2)
    model = make_model(kd.rank())
    opt = kd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                  average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="mse")
    model.fit(my_rows(x), my_rows(y), batch_size=B, shuffle=False, verbose=0)
    mine = flat(model.trainable_weights)
    identical(mine, "weights with accumulation")
    want = reference(lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), x, y)
    np.testing.assert_allclose(mine, want, **TOL)

    model = make_model(kd.rank())
    opt = kd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=2.0 ** 8))
    model.compile(optimizer=opt, loss="mse")
    model.fit(my_rows(x), my_rows(y), batch_size=B, shuffle=False, verbose=0)
    mine = flat(model.trainable_weights)
    identical(mine, "weights with loss scaling")
    want = reference(lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=2.0 ** 8), x, y)
    np.testing.assert_allclose(mine, want, **TOL)

    # A model with the "mixed_float16" policy: Keras' compile puts its own
    # LossScaleOptimizer around the distributed one. fit() moves the
    # reduction before the finite check, so a non-finite gradient on one
    # rank (a NaN in rank 0's second batch) makes every rank skip that step.
    opt = kd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = make_model(kd.rank())
        model.compile(optimizer=opt, loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float64")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    xs = my_rows(x).copy()
    if kd.rank() == 0:
        xs[B] = np.nan
    model.fit(xs, my_rows(y), batch_size=B, shuffle=False, verbose=0)
    assert getattr(model.optimizer, "_kerasdist_distributed", False)
    assert not getattr(model.optimizer.inner_optimizer, "_kerasdist_distributed", False)
    mine = flat(model.trainable_weights)
    assert np.all(np.isfinite(mine)), "a non-finite step was applied"
    identical(mine, "weights with Keras' own loss scaling and a NaN on one rank")


def check_callbacks(tmp):
    x, y = global_data(seed=3)
    model = make_model(kd.rank())
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    lrs = []
    seen = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: lrs.append(("begin", flat(model.weights))))

    class StopOnRank1(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if kd.rank() == 1 and epoch == 1:
                self.model.stop_training = True  # the others must stop too

    ckpt = os.path.join(tmp, "ckpt.keras")
    hist = model.fit(my_rows(x), my_rows(y), batch_size=B, epochs=5, shuffle=False, verbose=0,
                     callbacks=[kd.callbacks.BroadcastGlobalVariablesCallback(0), seen,
                                kd.callbacks.LearningRateWarmupCallback(
                                    initial_lr=0.1, warmup_epochs=2, verbose=0),
                                kd.callbacks.ModelCheckpoint(ckpt),
                                StopOnRank1()])
    identical(lrs[0][1], "weights after BroadcastGlobalVariablesCallback")
    assert len(hist.history["loss"]) == 2, hist.history
    assert kd.allgather_object(len(hist.history["loss"])) == [2] * kd.size()
    # The warmup ends at the target rate, the same everywhere.
    lr = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
    assert abs(lr - 0.1) < 1e-12, lr
    identical(flat(model.trainable_weights), "weights after callbacks")
    kd.barrier()
    assert os.path.exists(ckpt), ckpt  # written by rank 0 only (shared directory)
    restored = keras.models.load_model(ckpt)
    np.testing.assert_array_equal(flat(restored.trainable_weights),
                                  flat(model.trainable_weights))

    # BackupAndRestore: a second fit resumes from the backup of the first.
    backup = os.path.join(tmp, "backup")
    model = make_model(kd.rank())
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt("simulated failure")

    try:
        model.fit(my_rows(x), my_rows(y), batch_size=B, epochs=4, shuffle=False, verbose=0,
                  callbacks=[kd.callbacks.BackupAndRestore(backup, delete_checkpoint=False),
                             Interrupt()])
        raise AssertionError("the interrupt did not stop fit")
    except KeyboardInterrupt:
        pass
    saved = flat(model.trainable_weights)
    fresh = make_model(kd.rank() + 10)
    fresh.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    epochs = []
    fresh.fit(my_rows(x), my_rows(y), batch_size=B, epochs=2, shuffle=False, verbose=0,
              callbacks=[kd.callbacks.BackupAndRestore(backup),
                         keras.callbacks.LambdaCallback(
                             on_epoch_begin=lambda e, logs: epochs.append(e))])
    assert epochs == [], epochs  # both epochs were done before the interrupt
    np.testing.assert_array_equal(flat(fresh.trainable_weights), saved)


def check_unequal_steps_fail_on_every_rank():
    x, y = global_data(seed=6)
    model = make_model(0)
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    extra = B if kd.rank() == 0 else 0
    try:
        model.fit(my_rows(x)[:2 * B + extra], my_rows(y)[:2 * B + extra], batch_size=B,
                  verbose=0)
    except ValueError as e:
        assert "rank 0: 3" in str(e) and "rank 1: 2" in str(e), e
    else:
        raise AssertionError("unequal step counts were not refused")


def check_optimizer_options():
    x, y = global_data(seed=9)

    def fit(opt, seed=None):
        model = make_model(kd.rank() if seed is None else seed)
        model.compile(optimizer=opt, loss="mse")
        model.fit(my_rows(x), my_rows(y), batch_size=B, shuffle=False, verbose=0)
        return model

    want = reference(lambda: keras.optimizers.SGD(0.1), x, y)
    for what, kwargs, tol in (
            ("groups=2", dict(groups=2), TOL),
            ("gradient_predivide_factor=2", dict(gradient_predivide_factor=2.0), TOL),
            ("fp16 compression", dict(compression=kd.Compression.fp16),
             dict(rtol=1e-2, atol=1e-3))):
        mine = flat(fit(kd.DistributedOptimizer(keras.optimizers.SGD(0.1), **kwargs))
                    .trainable_weights)
        identical(mine, f"weights with {what}")
        np.testing.assert_allclose(mine, want, **tol, err_msg=what)
    # op=Sum adds the gradients up: with the rate divided by size(), as Average.
    mine = flat(fit(kd.DistributedOptimizer(keras.optimizers.SGD(0.1 / kd.size()), op=kd.Sum))
                .trainable_weights)
    np.testing.assert_allclose(mine, want, **TOL)

    # PartialDistributedOptimizer: the head's gradients stay on each rank.
    keras.utils.set_random_seed(0)
    model = make_model(0)
    head = model.layers[-1]
    opt = kd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[head])
    model.compile(optimizer=opt, loss="mse")
    model.fit(my_rows(x), my_rows(y), batch_size=B, shuffle=False, verbose=0)
    identical(flat(model.layers[0].trainable_weights), "the shared layer's weights")
    heads = kd.allgather_object(flat(head.trainable_weights))
    assert not np.array_equal(heads[0], heads[1]), "the local head was averaged"

    # load_model makes a saved model's optimizer distributed again.
    path = os.path.join(os.environ["KD_TMP"], f"opts.{kd.rank()}.keras")
    model.save(path)
    loaded = kd.load_model(path)
    assert getattr(loaded.optimizer, "_kerasdist_distributed", False)


def check_uneven_data_schedule_and_stop_sync():
    r = kd.rank()
    # Unknown lengths (a generator): rank r has 2 + r batches per epoch. The
    # ranks whose data ends join; the others go on; then all take the state
    # of the rank that joined last.
    model = make_model(0)
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    rng = np.random.default_rng(r)
    xs = rng.normal(size=(B * (2 + r), 5))
    ys = xs.sum(1, keepdims=True)

    uneven = kd.callbacks.UnevenDataCallback()

    def batches():
        for i in range(2 + r):
            yield xs[i * B:(i + 1) * B], ys[i * B:(i + 1) * B]

    for epoch in range(2):
        model.fit(batches(), epochs=1, verbose=0,
                  callbacks=[uneven, kd.callbacks.MetricAverageCallback()])
        assert uneven.join_each_epoch and uneven.last_joined == kd.size() - 1, \
            uneven.last_joined
        identical(flat(model.weights), f"weights after uneven epoch {epoch}")

    # A learning-rate schedule: the multiplier applies from start_epoch on.
    x, y = global_data(seed=8)
    model = make_model(r)
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(my_rows(x), my_rows(y), batch_size=B, epochs=3, shuffle=False, verbose=0,
              callbacks=[kd.callbacks.LearningRateScheduleCallback(
                  0.1, multiplier=lambda epoch: 0.5 ** epoch, start_epoch=1)])
    lr = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
    assert abs(lr - 0.1 * 0.25) < 1e-12, lr
    identical(flat(model.trainable_weights), "weights with a schedule")

    # SyncStopTrainingCallback with a plain optimizer (no fit guard): a stop
    # on the last rank stops every rank after the same epoch.
    class StopLast(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if kd.rank() == kd.size() - 1 and epoch == 0:
                self.model.stop_training = True

    model = make_model(r)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    hist = model.fit(my_rows(x), my_rows(y), batch_size=B, epochs=4, verbose=0,
                     callbacks=[StopLast(), kd.callbacks.SyncStopTrainingCallback()])
    assert kd.allgather_object(len(hist.history["loss"])) == [1] * kd.size()


def check_sync_batch_norm_in_fit():
    """In a model trained with fit: replicas stay identical, moving
    statistics too."""
    x, y = global_data(seed=4)
    model = make_model(kd.rank(), batch_norm=True)
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    model.fit(my_rows(x), my_rows(y), batch_size=B, shuffle=False, verbose=0,
              callbacks=[kd.callbacks.BroadcastGlobalVariablesCallback(0)])
    identical(flat(model.weights), "weights and statistics with SyncBatchNormalization")


def check_shard_arrays():
    n, r = kd.size(), kd.rank()
    x = np.arange(10 * n + 1)
    mine = kd.data.shard_arrays(x)
    assert len(mine) == 10 and list(mine) == list(range(r, 10 * n, n)), mine
    everyone = kd.allgather_object(list(mine))
    assert sorted(sum(everyone, [])) == list(range(10 * n))


def run_checks(own_checks, framework_untouched, log):
    """Runs the shared checks, then the backend's own, then the callbacks;
    after each, `framework_untouched()` asserts that the backend's own
    collectives were never set up (no DDP, no jax.distributed)."""
    for check in GENERIC + tuple(own_checks):
        check()
        framework_untouched()
        assert "tensorflow" not in sys.modules
        log(f"{check.__name__} passed")
    check_callbacks(os.environ["KD_TMP"])
    log("check_callbacks passed")


GENERIC = (check_fit_matches_one_process, check_accumulation_and_loss_scaling,
           check_unequal_steps_fail_on_every_rank, check_uneven_data_schedule_and_stop_sync,
           check_optimizer_options)

