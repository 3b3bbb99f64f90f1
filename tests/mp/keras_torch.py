"""Keras 3 on the torch backend with kerasdist, at np=2 and np=3.

Run with KERAS_BACKEND=torch and TensorFlow blocked from importing. The
checks every numpy-fed backend shares are in keras_common.py; here are
those that use torch itself (a custom loop with `backward()`, the
SyncBatchNormalization gradient, `DataLoader`s). `torch.distributed` must
stay uninitialized (no DDP). Prints "<name> passed".
"""

import warnings

import keras
import numpy as np
import torch

import kerasdist as kd
from _util import log, main
from keras_common import (B, STEPS, TOL, check_shard_arrays,
                          check_sync_batch_norm_in_fit, flat, global_data, identical,
                          make_model, my_rows, reference, run_checks)


def check_custom_loop_matches_one_process():
    x, y = global_data(seed=1)
    xs, ys = my_rows(x), my_rows(y)

    def train(model, opt):
        for s in range(STEPS):
            xb = torch.as_tensor(xs[s * B:(s + 1) * B])
            yb = torch.as_tensor(ys[s * B:(s + 1) * B])
            model.zero_grad()
            loss = keras.losses.mean_squared_error(yb, model(xb)).mean()
            loss.backward()
            variables = model.trainable_weights
            with torch.no_grad():
                opt.apply([v.value.grad for v in variables], variables)

    model = make_model(kd.rank())
    kd.broadcast_variables(model.variables, root_rank=0)
    train(model, kd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    mine = flat(model.trainable_weights)
    identical(mine, "weights after the custom loop")
    want = reference(lambda: keras.optimizers.Adam(0.01), x, y)
    np.testing.assert_allclose(mine, want, **TOL)

    # Without the broadcast, the first update makes the replicas equal and
    # warns that its gradients came from different weights.
    model = make_model(kd.rank())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model, kd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    assert any("weights differed" in str(w.message) for w in caught), caught
    identical(flat(model.trainable_weights), "weights after an unbroadcast custom loop")


def check_sync_batch_norm():
    rng = np.random.default_rng(7)
    everything = rng.normal(size=(3 * kd.size(), 4)) * 3 + 1
    mine = everything[kd.rank() * 3:(kd.rank() + 1) * 3]
    layer = kd.SyncBatchNormalization(epsilon=1e-5, momentum=0.0)
    inp = torch.tensor(mine, requires_grad=True)
    out = layer(inp, training=True)
    mean, var = everything.mean(0), everything.var(0)
    want = (mine - mean) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(out.detach().numpy(), want, **TOL)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.moving_mean), mean, **TOL)
    # The gradient flows through the allreduce: summed over the ranks, the
    # input gradient of sum(out * w) matches one process on all the rows.
    w = torch.as_tensor(np.arange(4.0))
    (out * w).sum().backward()
    grads = np.concatenate(kd.allgather_object(inp.grad.numpy()))
    full = torch.tensor(everything, requires_grad=True)
    ref = torch.nn.functional.batch_norm(full, None, None, training=True, eps=1e-5)
    (ref * w).sum().backward()
    np.testing.assert_allclose(grads, full.grad.numpy(), rtol=1e-5, atol=1e-6)
    check_sync_batch_norm_in_fit()


def check_data_helpers():
    n, r = kd.size(), kd.rank()
    check_shard_arrays()

    dataset = torch.utils.data.TensorDataset(torch.arange(7 * n + 2, dtype=torch.float64))
    sampler = kd.data.DistributedSampler(dataset, seed=3)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(dataset, batch_size=3, sampler=sampler)
        seen = [int(v) for (batch,) in loader for v in batch]
        everyone = kd.allgather_object(seen)
        assert len({len(s) for s in everyone}) == 1, everyone  # equal shares
        assert set(sum(everyone, [])) == set(range(7 * n + 2)), everyone  # all covered
        if epoch == 0:
            first = everyone
    assert everyone != first, "set_epoch did not reshuffle"

    # A DataLoader in fit: equal lengths on every rank, replicas identical.
    xg, yg = global_data(seed=5)
    data = torch.utils.data.TensorDataset(torch.as_tensor(xg), torch.as_tensor(yg))
    loader = torch.utils.data.DataLoader(
        data, batch_size=B, sampler=kd.data.DistributedSampler(data, shuffle=False))
    model = make_model(r)
    model.compile(optimizer=kd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    model.fit(loader, epochs=1, verbose=0)
    identical(flat(model.trainable_weights), "weights after fit on a DataLoader")


def run():
    def untouched():
        assert not torch.distributed.is_initialized(), "torch.distributed was initialized"

    run_checks((check_custom_loop_matches_one_process, check_sync_batch_norm,
                check_data_helpers), untouched, log)


if __name__ == "__main__":
    main(run)
