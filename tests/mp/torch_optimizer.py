"""kerasdist.torch's DistributedOptimizer and helpers at np=2 and np=3.

Each rank trains on its own shard; every result is compared with one
process training on the whole batch (float64, so that the sums agree to
rounding), and the replicas must be bit-identical. Prints "<name> passed".
"""

import os
import warnings

import numpy as np
import torch

import kerasdist.torch as hvd
from _util import log, main

torch.set_default_dtype(torch.float64)
PER_RANK = 4


class Net(torch.nn.Module):
    def __init__(self, branch=False):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 3, 3)
        self.fc = torch.nn.Linear(3 * 4 * 4, 5)
        self.extra = torch.nn.Linear(5, 5) if branch else None

    def forward(self, x, use_extra=False):
        y = self.fc(torch.relu(self.conv(x)).flatten(1))
        return self.extra(y) if use_extra else y


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    n = PER_RANK * hvd.size()
    return torch.randn(n, 1, 6, 6, generator=g), torch.randint(0, 5, (n,), generator=g)


def shard(x, y):
    r = hvd.rank()
    return x[r * PER_RANK:(r + 1) * PER_RANK], y[r * PER_RANK:(r + 1) * PER_RANK]


def identical_replicas(model, what):
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = hvd.allgather(flat[None], name=f"replicas.{what}")
    for q in range(hvd.size()):
        assert torch.equal(gathered[q], gathered[0]), (what, q)


def reference(steps, opt_fn, passes=1):
    model = Net()
    opt = opt_fn(model)
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            x, y = data(step * passes + k)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def train(steps, opt_fn, passes=1, **kwargs):
    model = Net()
    opt = hvd.DistributedOptimizer(opt_fn(model), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **kwargs)
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            x, y = shard(*data(step * passes + k))
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model, opt


def close(a, b, what, tol=1e-10):
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=tol, rtol=tol), (what, n, (p - q).abs().max())


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def adam(m):
    return torch.optim.Adam(m.parameters(), lr=0.01)


def check_matches_one_process():
    for name, fn in (("sgd", sgd), ("adam", adam)):
        model, _ = train(4, fn)
        close(model, reference(4, fn), name)
        identical_replicas(model, name)
    for cap in ("0", "1000"):  # one allreduce per parameter; several small buckets
        os.environ["KERASDIST_TORCH_BUCKET_BYTES"] = cap
        try:
            model, _ = train(3, sgd)
        finally:
            del os.environ["KERASDIST_TORCH_BUCKET_BYTES"]
        close(model, reference(3, sgd), f"buckets of {cap} bytes")
        identical_replicas(model, f"buckets {cap}")
    model, _ = train(3, sgd, groups=2)
    close(model, reference(3, sgd), "groups=2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model, _ = train(2, sgd, num_groups=3)
    close(model, reference(2, sgd), "num_groups=3")
    m = Net()
    model, _ = train(2, sgd, groups=[[p for n, p in m.named_parameters()][:0]])
    close(model, reference(2, sgd), "groups=list")
    model, _ = train(3, sgd, gradient_predivide_factor=2.0)
    close(model, reference(3, sgd), "predivide")
    model, _ = train(3, sgd, passes=2)
    # Both accumulate (sum) the two passes' gradients, as in Horovod.
    close(model, reference(3, sgd, passes=2), "backward_passes_per_step=2")
    identical_replicas(model, "passes")
    model, _ = train(2, sgd, op=hvd.Sum)
    ref = reference(2, lambda m: torch.optim.SGD(m.parameters(), lr=0.1 * hvd.size(),
                                                 momentum=0.9))
    close(model, ref, "Sum", tol=1e-9)
    model, _ = train(2, sgd, compression=hvd.Compression.fp16)
    close(model, reference(2, sgd), "fp16", tol=1e-2)
    identical_replicas(model, "fp16")
    log("check_matches_one_process passed")


def check_unused_parameters_and_synchronize():
    r = hvd.rank()
    model = Net(branch=True)
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    for step in range(3):
        opt.zero_grad()
        x, y = shard(*data(step))
        # Only rank 0 uses `extra` on odd steps: the others still take part.
        out = model(x, use_extra=(r == 0 and step % 2 == 1))
        torch.nn.functional.cross_entropy(out, y).backward()
        opt.step()
    identical_replicas(model, "unused")
    opt.zero_grad()
    x, y = shard(*data(9))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    try:
        opt.zero_grad()
        raise AssertionError("zero_grad() with allreduces in flight was accepted")
    except AssertionError as e:
        assert "before optimizer.step()" in str(e), e
    opt.synchronize()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    norms = hvd.allgather(norm.reshape(1))
    assert torch.equal(norms, norms[:1].expand_as(norms)), norms
    with opt.skip_synchronize():
        opt.step()
    identical_replicas(model, "clip")
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()  # without skip_synchronize(): Horovod's warning
    assert any("optimizer.step() called without optimizer.skip_synchronize()" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    identical_replicas(model, "step after synchronize")
    log("check_unused_parameters_and_synchronize passed")


def check_broadcast_parameters_and_optimizer_state():
    r = hvd.rank()
    model = Net()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(r)
    opt = adam(model)
    if r == 0:  # only the root has optimizer state, as after loading a checkpoint
        x, y = data(0)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    opt.param_groups[0]["lr"] = 0.5 if r == 0 else 0.1
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    identical_replicas(model, "broadcast_parameters")
    assert opt.param_groups[0]["lr"] == 0.5
    states = hvd.allgather_object({k: float(v["exp_avg"].sum()) for k, v in
                                   opt.state_dict()["state"].items()})
    assert all(s == states[0] for s in states) and states[0], states
    log("check_broadcast_parameters_and_optimizer_state passed")


def check_sync_batch_norm():
    torch.manual_seed(1)
    n = hvd.size()
    x = torch.randn(3 * n, 4, 5, 5)
    mine = x[hvd.rank() * 3:(hvd.rank() + 1) * 3].clone().requires_grad_()
    full = x.clone().requires_grad_()
    sync, plain = hvd.SyncBatchNorm(4), torch.nn.BatchNorm2d(4)
    weights = torch.randn(3 * n, 4, 5, 5)
    out = sync(mine)
    (out * weights[hvd.rank() * 3:(hvd.rank() + 1) * 3]).sum().backward()
    ref = plain(full)
    (ref * weights).sum().backward()
    part = slice(hvd.rank() * 3, (hvd.rank() + 1) * 3)
    assert torch.allclose(out, ref[part], atol=1e-10)
    assert torch.allclose(mine.grad, full.grad[part], atol=1e-10)
    # Weight gradients: each rank has its part; their sum is the full one.
    total = hvd.allreduce(sync.weight.grad, op=hvd.Sum)
    assert torch.allclose(total, plain.weight.grad, atol=1e-10)
    assert torch.allclose(sync.running_mean, plain.running_mean, atol=1e-12)
    assert torch.allclose(sync.running_var, plain.running_var, atol=1e-12)
    sync.eval()
    plain.eval()
    assert torch.allclose(sync(mine), plain(full)[part], atol=1e-10)
    log("check_sync_batch_norm passed")


def check_elastic_state(tmp):
    model = Net()
    opt = adam(model)
    state = hvd.elastic.TorchState(model, opt, checkpoint_dir=tmp, epoch=hvd.rank(), batch=0)
    state.sync()
    assert state.epoch == 0
    before = [p.detach().clone() for p in model.parameters()]
    state.commit()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    state.epoch = 5
    state.restore()
    assert state.epoch == 0
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)
    log("check_elastic_state passed")


def run():
    import tempfile

    check_matches_one_process()
    check_unused_parameters_and_synchronize()
    check_broadcast_parameters_and_optimizer_state()
    check_sync_batch_norm()
    check_elastic_state(tempfile.mkdtemp(prefix="kd_torch_elastic_"))


main(run)
