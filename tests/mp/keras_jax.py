"""Keras 3 on the JAX backend with kerasdist, at np=2 and np=3.

Run with KERAS_BACKEND=jax and TensorFlow blocked from importing. The
checks every numpy-fed backend shares are in keras_common.py (fit against
one process, accumulation, loss scaling, every callback, the fit guard,
uneven data, the optimizer's options); here are those that use JAX itself:
a custom loop that jits `stateless_apply`, the SyncBatchNormalization
gradient through `jax.grad`, the data helpers. `jax.distributed` must stay
uninitialized. Prints "<name> passed".
"""

import warnings

import jax

jax.config.update("jax_enable_x64", True)  # float64 models really are float64

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kerasdist as kd  # noqa: E402
from _util import log, main  # noqa: E402
from keras_common import (B, STEPS, TOL, check_shard_arrays,  # noqa: E402
                          check_sync_batch_norm_in_fit, flat, global_data, identical,
                          make_model, my_rows, reference, run_checks)


def _jitted_loop(model, opt, xs, ys):
    """Keras' custom-loop recipe for JAX: a jitted step around
    `stateless_apply`, which reduces the gradients in an XLA custom call."""
    opt.build(model.trainable_variables)

    def loss_fn(trainable, non_trainable, x, y):
        pred, non_trainable = model.stateless_call(trainable, non_trainable, x)
        return keras.losses.mean_squared_error(y, pred).mean(), non_trainable

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    @jax.jit
    def step(state, x, y):
        trainable, non_trainable, opt_vars = state
        (_, non_trainable), grads = grad_fn(trainable, non_trainable, x, y)
        trainable, opt_vars = opt.stateless_apply(opt_vars, grads, trainable)
        return trainable, non_trainable, opt_vars

    state = ([v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables], [v.value for v in opt.variables])
    for s in range(STEPS):
        state = step(state, xs[s * B:(s + 1) * B], ys[s * B:(s + 1) * B])
    for v, value in zip(model.trainable_variables, state[0]):
        v.assign(value)


def check_custom_loop_matches_one_process():
    x, y = global_data(seed=1)
    xs, ys = my_rows(x), my_rows(y)
    model = make_model(kd.rank())
    kd.broadcast_variables(model.variables, root_rank=0)
    _jitted_loop(model, kd.DistributedOptimizer(keras.optimizers.Adam(0.01)), xs, ys)
    mine = flat(model.trainable_weights)
    identical(mine, "weights after the jitted custom loop")
    np.testing.assert_allclose(mine, reference(lambda: keras.optimizers.Adam(0.01), x, y),
                               **TOL)

    # Without the broadcast nothing can fix the replicas inside jit: every
    # rank is warned at the first trace.
    model = make_model(kd.rank())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _jitted_loop(model, kd.DistributedOptimizer(keras.optimizers.Adam(0.01)), xs, ys)
    assert any("inside a traced (jitted) step" in str(w.message) for w in caught), caught
    try:
        kd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=kd.Adasum)
    except NotImplementedError as e:
        assert "JAX backend" in str(e), e
    else:
        raise AssertionError("op=Adasum was accepted on the JAX backend")


def check_sync_batch_norm():
    rng = np.random.default_rng(7)
    everything = rng.normal(size=(3 * kd.size(), 4)) * 3 + 1
    mine = everything[kd.rank() * 3:(kd.rank() + 1) * 3]
    layer = kd.SyncBatchNormalization(epsilon=1e-5, momentum=0.0)
    layer.build(mine.shape)
    mean, var = everything.mean(0), everything.var(0)
    want = (mine - mean) / np.sqrt(var + 1e-5)
    w = np.arange(4.0)

    def loss(x, trainable, non_trainable):
        out, _ = layer.stateless_call(trainable, non_trainable, x, training=True)
        return (out * w).sum(), out

    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]
    for mode in ("eager", "jit"):
        fn = jax.value_and_grad(loss, has_aux=True)
        fn = jax.jit(fn) if mode == "jit" else fn
        (_, out), grad = fn(mine, trainable, non_trainable)
        np.testing.assert_allclose(np.asarray(out), want, **TOL)
        # The gradient flows through the allreduce: gathered over the ranks,
        # the input gradient matches one process's on all the rows.
        grads = np.concatenate(kd.allgather_object(np.asarray(grad)))
        ref = jax.grad(lambda x: (((x - x.mean(0)) / jax.numpy.sqrt(x.var(0) + 1e-5)) * w).sum())(
            everything)
        np.testing.assert_allclose(grads, np.asarray(ref), rtol=1e-5, atol=1e-6)
    check_sync_batch_norm_in_fit()


def check_data_helpers():
    check_shard_arrays()
    n = kd.size()
    sampler = kd.data.DistributedSampler(list(range(7 * n + 2)), seed=3)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        everyone = kd.allgather_object(list(sampler))
        assert len({len(s) for s in everyone}) == 1, everyone  # equal shares
        assert set(sum(everyone, [])) == set(range(7 * n + 2)), everyone  # all covered
        if epoch == 0:
            first = everyone
    assert everyone != first, "set_epoch did not reshuffle"


def run():
    def untouched():
        assert not jax.distributed.is_initialized(), "jax.distributed was initialized"

    run_checks((check_custom_loop_matches_one_process, check_sync_batch_norm,
                check_data_helpers), untouched, log)


if __name__ == "__main__":
    main(run)
