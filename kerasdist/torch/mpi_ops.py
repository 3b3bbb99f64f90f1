"""Horovod's asynchronous collectives on PyTorch tensors, on kerasdist's
engine.

Each `*_async` function enqueues its collective and returns an integer
handle at once; `poll(handle)` tells whether it completed and
`synchronize(handle)` waits and returns the output. The trailing-underscore
forms work in place. Collectives are matched across ranks by name: give the
same `name` on every rank, or leave it `None` and issue the same sequence
of unnamed calls on every rank. The differentiable synchronous forms are in
kerasdist/torch/collectives.py.
"""

import ctypes
import warnings

import torch

from kerasdist.common import handles as _h
from kerasdist.common import process_sets as _sets
from kerasdist.common.context import check_initialized, context
from kerasdist.common.process_sets import global_process_set
from kerasdist.torch import handles as _th

# The reduce ops, as the engine numbers them.
from kerasdist.common.reduce_ops import (  # noqa: E402,F401
    OP_NAMES, Adasum, Average, Max, Min, Product, Sum)


def resolve_op(op, average, what, default=Average):
    """Horovod's deprecated `average=` mapped onto `op`; checks `op`."""
    if average is not None:
        if op is not None:
            raise ValueError(
                f"`{what}` takes `op` or the deprecated `average`, not both. "
                f"Received: op={op!r}, average={average!r}")
        warnings.warn(
            f"The `average` argument of `{what}` is deprecated, as in Horovod. Use "
            "`op=kerasdist.torch.Average` (average=True) or `op=kerasdist.torch.Sum` "
            "(average=False) instead.", DeprecationWarning, stacklevel=3)
        op = Average if average else Sum
    if op is None:
        op = default
    if isinstance(op, bool) or op not in OP_NAMES:
        raise ValueError(
            f"Invalid value for argument `op` of `{what}`. Expected one of "
            "Average, Sum, Min, Max, Product, Adasum. Received: op=" + repr(op))
    return op


def _check_adasum(op, set_id, what):
    if op != Adasum:
        return
    if set_id != 0:
        raise NotImplementedError(
            f"`{what}` with op=Adasum runs on the global process set only, as in Horovod.")
    n = context.size
    if n & (n - 1):
        raise NotImplementedError(
            f"`{what}` with op=Adasum needs a power-of-two number of ranks, as in "
            f"Horovod. This job has {n}.")


def _name(kind, name, set_id):
    if name is None:
        return context.next_name(f"torch.{kind}" + (f".set{set_id}" if set_id else ""),
                                 pooled=False)
    if not isinstance(name, str) or not name:
        raise TypeError(f"Invalid value for argument `name`. Expected a non-empty str or "
                        f"None. Received: name={name!r}")
    return name


def _prepare(tensor, what):
    check_initialized()
    code = _th.check_tensor(tensor, what)
    return code, _th.contiguous(tensor)


def _allreduce(tensors, outputs, name, op, prescale_factor, postscale_factor, process_set,
               what, grouped):
    check_initialized()
    set_id, _ = _sets.resolve(process_set, what)
    _check_adasum(op, set_id, what)
    name = _name("grouped_allreduce" if grouped else "allreduce", name, set_id)
    reqs, keep, writes = [], [], []
    for i, (tensor, output) in enumerate(zip(tensors, outputs)):
        code, src = _prepare(tensor, what)
        if output is tensor:
            dst = src  # in place; a non-contiguous tensor is written back
            if src is not tensor:
                writes.append((tensor, src))
        else:
            dst = output
        reqs.append(_th.request(
            _h.ALLREDUCE, f"{name}.{i}" if grouped else name, src, dst, code,
            process_set_id=set_id, reduce_op=op, prescale=float(prescale_factor),
            postscale=float(postscale_factor)))
        keep += [src, dst]
    result = list(outputs) if grouped else outputs[0]

    def finish(_):
        for tensor, src in writes:
            tensor.copy_(src)
        return result

    return _th.submit(reqs, keep, finish, group_name=name if grouped else None)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over the ranks; returns a handle.

    Args:
        tensor: A CPU tensor of a supported dtype (any layout in memory).
        average: Deprecated (as in Horovod); use `op`. Defaults to `None`.
        name: The name that matches this collective across ranks. Defaults
            to `None` (derived from the order of unnamed calls).
        op: `Average`, `Sum`, `Min`, `Max`, `Product` or `Adasum`.
            Defaults to `None` (`Average`). Integer averages truncate toward
            zero.
        prescale_factor: Multiplies the input before the reduction.
            Defaults to 1.0.
        postscale_factor: Multiplies the result after it. Defaults to 1.0.
        process_set: The `ProcessSet` to reduce over. Defaults to
            `global_process_set`.

    Returns:
        A handle for `poll()` and `synchronize()`, which returns a new tensor
        with the result.
    """
    op = resolve_op(op, average, "allreduce_async")
    output = torch.empty(tensor.shape, dtype=tensor.dtype) if isinstance(
        tensor, torch.Tensor) else None
    return _allreduce([tensor], [output], name, op, prescale_factor, postscale_factor,
                      process_set, "allreduce_async", grouped=False)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """`allreduce_async` in place: `synchronize()` returns `tensor`, which
    holds the result."""
    op = resolve_op(op, average, "allreduce_async_")
    return _allreduce([tensor], [tensor], name, op, prescale_factor, postscale_factor,
                      process_set, "allreduce_async_", grouped=False)


def tensor_list(tensors, what):
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"Invalid type for argument `tensors` of `{what}`. Expected a list "
                        f"of tensors. Received: {type(tensors).__name__}")
    return list(tensors)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing a list of tensors as one group (one negotiation, one
    fused reduction); `synchronize()` returns the list of results."""
    op = resolve_op(op, average, "grouped_allreduce_async")
    tensors = tensor_list(tensors, "grouped_allreduce_async")
    outputs = [torch.empty(t.shape, dtype=t.dtype) if isinstance(t, torch.Tensor) else None
               for t in tensors]
    return _allreduce(tensors, outputs, name, op, prescale_factor, postscale_factor,
                      process_set, "grouped_allreduce_async", grouped=True)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """`grouped_allreduce_async` in place."""
    op = resolve_op(op, average, "grouped_allreduce_async_")
    tensors = tensor_list(tensors, "grouped_allreduce_async_")
    return _allreduce(tensors, tensors, name, op, prescale_factor, postscale_factor,
                      process_set, "grouped_allreduce_async_", grouped=True)


def _gather(tensors, name, process_set, what, grouped):
    check_initialized()
    set_id, _ = _sets.resolve(process_set, what)
    name = _name("grouped_allgather" if grouped else "allgather", name, set_id)
    reqs, keep = [], []
    for i, tensor in enumerate(tensors):
        code, src = _prepare(tensor, what)
        reqs.append(_th.request(_h.ALLGATHER, f"{name}.{i}" if grouped else name, src,
                                code=code, process_set_id=set_id))
        keep.append(src)

    def finish(handle):
        out = [_th.held_output(handle, i, t) for i, t in enumerate(tensors)]
        return out if grouped else out[0]

    return _th.submit(reqs, keep, finish)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's `tensor` along the first dimension,
    in rank order; the first dimension may differ across ranks. Returns a
    handle; `synchronize()` returns the gathered tensor."""
    return _gather([tensor], name, process_set, "allgather_async", grouped=False)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """`allgather_async` of a list of tensors as one batch."""
    return _gather(tensor_list(tensors, "grouped_allgather_async"), name, process_set,
                   "grouped_allgather_async", grouped=True)


def _broadcast(tensor, output, root_rank, name, process_set, what):
    check_initialized()
    set_id, root = _sets.set_root(root_rank, process_set, what)
    code, src = _prepare(tensor, what)
    name = _name("broadcast", name, set_id)
    dst = src if output is tensor else output
    req = _th.request(_h.BROADCAST, name, src, dst, code, process_set_id=set_id, root=root)

    def finish(_):
        if output is tensor and src is not tensor:
            tensor.copy_(src)
        return output

    return _th.submit([req], [src, dst], finish)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts sending `root_rank`'s `tensor` to every rank; returns a handle.

    `root_rank` is a rank of the whole job (a member of `process_set`);
    `synchronize()` returns a new tensor with the root's values.
    """
    output = torch.empty(tensor.shape, dtype=tensor.dtype) if isinstance(
        tensor, torch.Tensor) else None
    return _broadcast(tensor, output, root_rank, name, process_set, "broadcast_async")


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """`broadcast_async` in place: `tensor` receives the root's values."""
    return _broadcast(tensor, tensor, root_rank, name, process_set, "broadcast_async_")


def _splits_list(splits):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dim() != 1:
            raise ValueError("Invalid value for argument `splits` of `alltoall`. Expected a "
                             f"1-D tensor of integers. Received: {splits.dtype} of shape "
                             f"{tuple(splits.shape)}")
        splits = splits.tolist()
    try:
        return [int(s) for s in splits]
    except (TypeError, ValueError):
        raise TypeError("Invalid value for argument `splits` of `alltoall`. Expected a "
                        f"list or 1-D tensor of integers. Received: {splits!r}") from None


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall: rank i sends `splits[j]` rows of `tensor` (along
    the first dimension, in order) to rank j of the process set, and
    receives rows from every rank, concatenated in rank order.

    Args:
        tensor: The rows to send.
        splits: Rows for each rank (a list or 1-D tensor of integers).
            Defaults to `None`: the first dimension split evenly.
        name, process_set: As in `allreduce_async`.

    Returns:
        A handle; `synchronize()` returns `(output, received_splits)`, the
        latter an int32 tensor of the rows received from each rank.
    """
    check_initialized()
    what = "alltoall_async"
    set_id, _ = _sets.resolve(process_set, what)
    code, src = _prepare(tensor, what)
    name = _name("alltoall", name, set_id)
    split_list = _splits_list(splits)
    req = _th.request(_h.ALLTOALL, name, src, code=code, process_set_id=set_id,
                      splits=split_list)
    set_size = _sets.rank_size(set_id)[1]
    rows = src.shape[0] if src.dim() else 0
    own_fault = None
    if split_list is None and rows % set_size:
        own_fault = (f"`alltoall` without `splits` needs a first dimension divisible by the "
                     f"process set's size ({set_size}). Received: {rows} rows")
    elif split_list is not None and (len(split_list) != set_size or min(split_list) < 0
                                     or sum(split_list) != rows):
        own_fault = (f"Invalid `splits` for `alltoall`: expected {set_size} non-negative "
                     f"counts that sum to the first dimension ({rows}). "
                     f"Received: splits={split_list}")

    def finish(handle):
        output = _th.held_output(handle, 0, tensor)
        received = torch.tensor(handle.received_splits(0), dtype=torch.int32)
        return output, received

    return _th.submit([req], [src], finish, own_fault=own_fault)


def _check_scatter_op(op, what):
    if op == Adasum and not isinstance(op, bool):
        raise NotImplementedError(f"`{what}` does not support op=Adasum, as in Horovod. "
                                  "Use Average or Sum.")
    if op not in (Average, Sum) or isinstance(op, bool):
        raise ValueError(f"Invalid value for argument `op` of `{what}`. Expected Average or "
                         f"Sum (as in Horovod). Received: op={op!r}")


def _scatter(tensors, name, op, process_set, prescale_factor, postscale_factor, what,
             grouped):
    check_initialized()
    _check_scatter_op(op, what)
    set_id, _ = _sets.resolve(process_set, what)
    set_rank, set_size = _sets.rank_size(set_id)
    name = _name("grouped_reducescatter" if grouped else "reducescatter", name, set_id)
    reqs, keep, outputs = [], [], []
    for i, tensor in enumerate(tensors):
        code, src = _prepare(tensor, what)
        if src.dim() < 1:
            raise ValueError(f"`{what}` requires tensors with at least one dimension. "
                             "Received a scalar; reshape it to [1].")
        rows = src.shape[0] // set_size + (1 if set_rank < src.shape[0] % set_size else 0)
        out = torch.empty((rows,) + tuple(src.shape[1:]), dtype=src.dtype)
        reqs.append(_th.request(
            _h.REDUCESCATTER, f"{name}.{i}" if grouped else name, src, out, code,
            process_set_id=set_id, reduce_op=op, prescale=float(prescale_factor),
            postscale=float(postscale_factor)))
        keep += [src, out]
        outputs.append(out)
    return _th.submit(reqs, keep, lambda _: outputs if grouped else outputs[0])


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing `tensor` over the ranks and scattering the result
    along the first dimension: rank i of the process set receives the i-th
    block of rows (the first `dim0 % size` ranks one row more). `op` is
    `Average` or `Sum`. Returns a handle; `synchronize()` returns this
    rank's rows."""
    return _scatter([tensor], name, op, process_set, prescale_factor, postscale_factor,
                    "reducescatter_async", grouped=False)


def grouped_reducescatter_async(tensors, name=None, op=Average,
                                process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    """`reducescatter_async` of a list of tensors as one batch."""
    return _scatter(tensor_list(tensors, "grouped_reducescatter_async"), name, op,
                    process_set, prescale_factor, postscale_factor,
                    "grouped_reducescatter_async", grouped=True)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts reducing a sparse COO tensor by allgathering its indices and
    values, as Horovod does; returns a function that waits and returns the
    reduced sparse tensor (duplicate indices are summed when it is
    coalesced). `op` is `Average` or `Sum`."""
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        raise TypeError("`sparse_allreduce_async` takes a sparse COO tensor. Received: "
                        f"{type(tensor).__name__} {getattr(tensor, 'layout', '')}")
    _check_scatter_op(op, "sparse_allreduce_async")
    t = tensor.coalesce()
    indices = allgather_async(t.indices().transpose(0, 1).contiguous(),
                              name=f"{name}.indices", process_set=process_set)
    values = allgather_async(t.values(), name=f"{name}.values", process_set=process_set)
    set_size = _sets.rank_size(_sets.resolve(process_set, "sparse_allreduce_async")[0])[1]

    def handle():
        v = _th.synchronize(values)
        i = _th.synchronize(indices)
        if op == Average:
            v = v / set_size
        return torch.sparse_coo_tensor(i.transpose(0, 1), v, t.shape)

    return handle


def join(device=-1):
    """Tells the other ranks this rank has no more data; until every rank
    has joined, it takes part in their allreduces with zeros. Returns the
    last rank to join.

    Args:
        device: Unused (CPU only); accepted for Horovod compatibility.
    """
    del device
    check_initialized()
    last = ctypes.c_int32(-1)
    req, keep = _h.raw_request(_h.JOIN, _h.JOIN_NAME)
    req.join_result = ctypes.pointer(last)
    handle = _th.submit([(req, keep + [last])], [last], lambda _: int(last.value))
    return _th.synchronize(handle)


def barrier(process_set=global_process_set):
    """Waits until every rank of `process_set` has called `barrier`."""
    check_initialized()
    set_id, _ = _sets.resolve(process_set, "barrier")
    handle = _th.submit([_h.raw_request(_h.BARRIER, _name("barrier", None, set_id),
                                        process_set_id=set_id)], [], lambda _: None)
    _th.synchronize(handle)
