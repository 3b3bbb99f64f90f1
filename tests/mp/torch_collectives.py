"""kerasdist.torch's collectives at np=2 and np=3, against numpy.

Every check prints "<name> passed" on every rank; tests/test_torch_mp.py
counts them. Values are small integers, so that every dtype's result is
exact and the expected values are computed in float64 with numpy.
"""

import numpy as np
import torch

import kerasdist.torch as hvd
from _util import log, main

INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPES = INTS + FLOATS


def value(rank, shape, dtype, low=1, high=4):
    """Rank `rank`'s deterministic small-integer tensor."""
    n = int(np.prod(shape)) if shape else 1
    base = (np.arange(n) * 7 + rank * 3) % (high - low) + low
    return torch.tensor(base.reshape(shape), dtype=torch.float64).to(dtype)


def as_np(t):
    return t.to(torch.float64).numpy() if t.dtype != torch.bool else t.numpy()


def same(got, want, what):
    got = as_np(got)
    assert got.shape == np.shape(want), (what, got.shape, np.shape(want))
    assert np.array_equal(got, want), (what, got, want)


def check_allreduce_every_dtype_and_op():
    r, n = hvd.rank(), hvd.size()
    for dtype in DTYPES:
        for op, fold in ((hvd.Sum, np.sum), (hvd.Min, np.min), (hvd.Max, np.max),
                         (hvd.Product, np.prod), (hvd.Average, None)):
            shape = (3, 5)
            xs = [as_np(value(q, shape, dtype)) for q in range(n)]
            if op == hvd.Average:
                want = np.sum(xs, axis=0) / n
                if not dtype.is_floating_point:
                    want = np.trunc(want)
            else:
                want = fold(xs, axis=0)
            got = hvd.allreduce(value(r, shape, dtype), op=op, name=f"ar.{dtype}.{op}")
            assert got.dtype == dtype
            if dtype in (torch.float16, torch.bfloat16) and op == hvd.Average:
                assert np.allclose(as_np(got), want, rtol=1e-2), (dtype, op)
            else:
                same(got, want, (dtype, op))
    for op, fold in ((hvd.Min, np.all), (hvd.Max, np.any)):
        x = torch.tensor([True, r % 2 == 0, False, r == 0])
        want = fold([[True, q % 2 == 0, False, q == 0] for q in range(n)], axis=0)
        same(hvd.allreduce(x, op=op), want, ("bool", op))
    log("check_allreduce_every_dtype_and_op passed")


def check_scale_factors_inplace_and_noncontiguous():
    r, n = hvd.rank(), hvd.size()
    x = value(r, (4, 6), torch.float32)
    want = sum(as_np(value(q, (4, 6), torch.float32)) for q in range(n)) * 0.5 * 4.0
    same(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0), want, "scale")
    t = value(r, (6, 4), torch.float64).t()  # non-contiguous
    assert not t.is_contiguous()
    want_t = sum(as_np(value(q, (6, 4), torch.float64)).T for q in range(n))
    out = hvd.allreduce_(t, op=hvd.Sum)
    assert out is t
    same(t, want_t, "in place, non-contiguous")
    same(hvd.allreduce(value(r, (6, 4), torch.float64).t(), op=hvd.Sum), want_t, "out of place")
    empty = hvd.allreduce(torch.zeros(0, 3), op=hvd.Sum)
    assert empty.shape == (0, 3)
    scalar = hvd.allreduce(torch.tensor(float(r)), op=hvd.Sum)
    same(scalar, np.float64(sum(range(n))), "scalar")
    log("check_scale_factors_inplace_and_noncontiguous passed")


def check_async_handles_and_grouped():
    r, n = hvd.rank(), hvd.size()
    xs = [value(r, (i + 1, 3), torch.float32) for i in range(40)]
    handles = [hvd.allreduce_async(x, op=hvd.Sum) for x in xs]
    for i, h in reversed(list(enumerate(handles))):
        want = sum(as_np(value(q, (i + 1, 3), torch.float32)) for q in range(n))
        same(hvd.synchronize(h), want, f"async {i}")
    h = hvd.allreduce_async_(xs[0], name="inplace.async", op=hvd.Max)
    while not hvd.poll(h):
        pass
    assert hvd.synchronize(h) is xs[0]
    mixed = [value(r, (2, 2), torch.float32), value(r, (5,), torch.int64),
             value(r, (3, 1), torch.float64)]
    outs = hvd.grouped_allreduce(mixed, op=hvd.Sum, name="grouped.mixed")
    for i, out in enumerate(outs):
        want = sum(as_np(value(q, tuple(mixed[i].shape), mixed[i].dtype)) for q in range(n))
        same(out, want, f"grouped {i}")
    inplace = [m.clone() for m in mixed]
    assert hvd.grouped_allreduce_(inplace, op=hvd.Sum)[1] is inplace[1]
    for a, b in zip(inplace, outs):
        assert torch.equal(a, b)
    try:
        hvd.synchronize(h)
        raise AssertionError("a synchronized handle was accepted again")
    except ValueError as e:
        assert "handle" in str(e)
    # A name is free again once its collective was synchronized; 300 pending
    # handles are checked by name, not one by one.
    many = [hvd.allreduce_async(torch.ones(1), name=f"many.{i}") for i in range(300)]
    for h in many:
        hvd.synchronize(h)
    again = hvd.allreduce_async(torch.ones(1), name="many.0", op=hvd.Sum)
    same(hvd.synchronize(again), np.array([float(n)]), "a name reused after its end")
    log("check_async_handles_and_grouped passed")


def check_allgather_broadcast():
    r, n = hvd.rank(), hvd.size()
    for dtype in DTYPES + [torch.bool]:
        mine = value(r, (r + 1, 2), dtype) if dtype != torch.bool else \
            torch.tensor([[r % 2 == 0, True]] * (r + 1))
        parts = [as_np(value(q, (q + 1, 2), dtype)) if dtype != torch.bool else
                 np.array([[q % 2 == 0, True]] * (q + 1)) for q in range(n)]
        got = hvd.allgather(mine, name=f"ag.{dtype}")
        assert got.dtype == dtype
        same(got, np.concatenate(parts), ("allgather", dtype))
        for root in range(n):
            x = value(r, (2, 3), dtype) if dtype != torch.bool else torch.tensor([r == root] * 3)
            want = as_np(value(root, (2, 3), dtype)) if dtype != torch.bool else \
                np.array([True] * 3)
            same(hvd.broadcast(x, root, name=f"bc.{dtype}.{root}"), want, ("bcast", dtype))
            y = x.clone()
            assert hvd.broadcast_(y, root, name=f"bc_.{dtype}.{root}") is y
            same(y, want, ("bcast_", dtype))
    a, b = hvd.grouped_allgather([torch.full((r + 1,), r), torch.full((1, 2), float(r))])
    same(a, np.concatenate([[q] * (q + 1) for q in range(n)]), "grouped allgather a")
    same(b, np.array([[q, q] for q in range(n)], dtype=float), "grouped allgather b")
    log("check_allgather_broadcast passed")


def check_alltoall_reducescatter():
    r, n = hvd.rank(), hvd.size()
    for dtype in (torch.int32, torch.float32, torch.bfloat16, torch.uint8):
        splits = [(r + j) % 2 + 1 for j in range(n)]
        rows = torch.cat([torch.full((s, 2), 10 * r + j) for j, s in enumerate(splits)]).to(dtype)
        out, received = hvd.alltoall(rows, splits=splits, name=f"a2a.{dtype}")
        want = np.concatenate([np.full(((q + r) % 2 + 1, 2), 10 * q + r) for q in range(n)])
        same(out, want, ("alltoall", dtype))
        assert received.tolist() == [(q + r) % 2 + 1 for q in range(n)], received
        even = hvd.alltoall(torch.arange(2 * n).to(dtype))
        same(even, np.array([2 * r + k for q in range(n) for k in range(2)]), "even")
    for op in (hvd.Sum, hvd.Average):
        rows = 2 * n + 1  # uneven: the first rank gets one row more
        xs = [as_np(value(q, (rows, 3), torch.float64)) for q in range(n)]
        total = np.sum(xs, axis=0) / (n if op == hvd.Average else 1)
        start = r * (rows // n) + min(r, rows % n)
        count = rows // n + (1 if r < rows % n else 0)
        got = hvd.reducescatter(value(r, (rows, 3), torch.float64), op=op)
        same(got, total[start:start + count], ("reducescatter", op))
    g = hvd.grouped_reducescatter([torch.ones(n, 2) * r, torch.ones(n) * 2], op=hvd.Sum)
    same(g[0], np.full((1, 2), sum(range(n)), dtype=float), "grouped rs 0")
    same(g[1], np.full((1,), 2.0 * n), "grouped rs 1")
    try:
        hvd.reducescatter(torch.ones(n), op=hvd.Max)
        raise AssertionError("reducescatter accepted Max")
    except ValueError as e:
        assert "Average or" in str(e)
    log("check_alltoall_reducescatter passed")


def check_gradients():
    r, n = hvd.rank(), hvd.size()
    x = value(r, (3, 2), torch.float64).requires_grad_()
    (hvd.allreduce(x, op=hvd.Sum) * (r + 1)).sum().backward()
    same(x.grad, np.full((3, 2), float(sum(q + 1 for q in range(n)))), "allreduce grad")
    x = torch.ones(r + 1, 2, dtype=torch.float64, requires_grad=True)
    g = hvd.allgather(x)
    (g * torch.arange(g.shape[0], dtype=torch.float64)[:, None]).sum().backward()
    start = sum(q + 1 for q in range(r))
    same(x.grad, np.repeat(np.arange(start, start + r + 1, dtype=float)[:, None], 2, 1),
         "allgather grad (averaged, as in Horovod)")
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    (hvd.broadcast(x, 0) * 3).sum().backward()
    same(x.grad, np.full(4, 3.0 if r == 0 else 0.0), "broadcast grad")
    x = torch.arange(2.0 * n, dtype=torch.float64).requires_grad_()
    out = hvd.alltoall(x)
    (out * (r + 1)).sum().backward()
    same(x.grad, np.repeat(np.arange(1.0, n + 1), 2), "alltoall grad")
    x = torch.ones(n, 2, dtype=torch.float64, requires_grad=True)
    (hvd.reducescatter(x, op=hvd.Sum) * 2).sum().backward()
    same(x.grad, np.full((n, 2), 2.0 * n), "reducescatter grad (times size for Sum)")
    xs = [torch.ones(2, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Average)
    (outs[0] * 2 + outs[1]).sum().backward()
    same(xs[0].grad, np.full(2, 2.0), "grouped grad 0")
    same(xs[1].grad, np.full(2, 1.0), "grouped grad 1")
    log("check_gradients passed")


def check_process_sets_and_join():
    r, n = hvd.rank(), hvd.size()
    pair = hvd.add_process_set([0, 1])
    if pair.included():
        same(hvd.allreduce(torch.tensor([r + 1.0]), op=hvd.Sum, process_set=pair),
             np.array([3.0]), "set allreduce")
        same(hvd.broadcast(torch.tensor([float(r)]), 1, process_set=pair), np.array([1.0]),
             "set broadcast")
        same(hvd.allgather(torch.tensor([r]), process_set=pair), np.array([0, 1]), "set ag")
    else:
        try:
            hvd.allreduce(torch.ones(1), process_set=pair)
            raise AssertionError("a non-member ran a collective on the set")
        except ValueError as e:
            assert "not in it" in str(e)
    hvd.remove_process_set(pair)
    if r == 0:
        last = hvd.join()
    else:
        got = hvd.allreduce(torch.tensor([5.0 * r]), op=hvd.Sum, name="uneven")
        same(got, np.array([5.0 * sum(range(1, n))]), "joined rank adds zeros")
        last = hvd.join()
    assert 0 <= last < n
    log("check_process_sets_and_join passed")


def check_sparse_and_adasum():
    r, n = hvd.rank(), hvd.size()
    sp = torch.sparse_coo_tensor([[r, 0]], [1.0 + r, 2.0], (n, ))
    got = hvd.sparse_allreduce_async(sp, name="sparse", op=hvd.Sum)().coalesce().to_dense()
    want = np.zeros(n)
    for q in range(n):
        want[q] += 1.0 + q
        want[0] += 2.0
    same(got, want, "sparse")
    if n & (n - 1) == 0:
        a = torch.tensor([1.0, 2.0, 0.5 * r], dtype=torch.float64)
        vecs = [np.array([1.0, 2.0, 0.5 * q]) for q in range(n)]
        while len(vecs) > 1:
            u, v = vecs[0], vecs[1]
            d = u @ v
            vecs = [(1 - d / (2 * (u @ u))) * u + (1 - d / (2 * (v @ v))) * v] + vecs[2:]
        assert np.allclose(as_np(hvd.allreduce(a, op=hvd.Adasum)), vecs[0])
    else:
        try:
            hvd.allreduce(torch.ones(2), op=hvd.Adasum)
            raise AssertionError("Adasum ran on a non-power-of-two job")
        except NotImplementedError as e:
            assert "power-of-two" in str(e)
    log("check_sparse_and_adasum passed")


def check_objects_and_queries():
    r, n = hvd.rank(), hvd.size()
    assert hvd.allgather_object({"r": r}) == [{"r": q} for q in range(n)]
    assert hvd.broadcast_object([r, "x"], root_rank=n - 1) == [n - 1, "x"]
    assert hvd.mpi_built() and not hvd.gloo_built() and not hvd.nccl_built()
    assert hvd.is_initialized() and hvd.local_size() == n and hvd.cross_size() == 1
    # init() gave PyTorch this rank's share of the cores (no OMP_NUM_THREADS here).
    import os
    if "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0))
        assert torch.get_num_threads() == max(1, cores // n), torch.get_num_threads()
    hvd.barrier()
    log("check_objects_and_queries passed")


def run():
    for check in (check_allreduce_every_dtype_and_op,
                  check_scale_factors_inplace_and_noncontiguous,
                  check_async_handles_and_grouped, check_allgather_broadcast,
                  check_alltoall_reducescatter, check_gradients,
                  check_process_sets_and_join, check_sparse_and_adasum,
                  check_objects_and_queries):
        check()


main(run)
