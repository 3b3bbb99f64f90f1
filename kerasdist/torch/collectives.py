"""Horovod's synchronous collectives on PyTorch tensors, differentiable.

Each function waits for its collective and returns the result. The
out-of-place ones are `torch.autograd.Function`s with Horovod's gradients:
- allreduce: the gradient is allreduced with the same op and scale
  factors;
- allgather: the gradient is averaged over the ranks and this rank's rows
  are taken;
- broadcast: the gradient is averaged over the ranks and kept on the root
  only (zeros elsewhere);
- alltoall: the gradient goes back with an alltoall by the received splits;
- reducescatter: the gradient is allgathered (times the set's size for Sum,
  times the scale factors).
"""

import torch

from kerasdist.common import process_sets as _sets
from kerasdist.common.context import context
from kerasdist.common.process_sets import global_process_set
from kerasdist.torch import mpi_ops as _ops
from kerasdist.torch.compression import Compression
from kerasdist.torch.handles import synchronize


def _set_size(process_set):
    return _sets.rank_size(_sets.resolve(process_set, "backward")[0])[1]


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.process_set = op, process_set
        ctx.scales = (prescale_factor, postscale_factor)
        return synchronize(_ops.allreduce_async(
            tensor, name=name, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        pre, post = ctx.scales
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=pre, postscale_factor=post,
                         process_set=ctx.process_set)
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` over the ranks; every rank receives the result.

    Differentiable: the gradient is the allreduce of the output's gradient
    with the same op and scale factors, as in Horovod.

    Args:
        tensor: A CPU tensor of a supported dtype.
        average: Deprecated (as in Horovod); use `op`. Defaults to `None`.
        name: The name that matches this collective across ranks. Defaults
            to `None`.
        compression: `Compression.none`, `fp16` or `bf16`, for the wire.
            Defaults to `Compression.none`.
        op: `Average`, `Sum`, `Min`, `Max`, `Product` or `Adasum`. Defaults
            to `None` (`Average`).
        prescale_factor, postscale_factor: Multiply the input before and
            the result after the reduction. Default to 1.0.
        process_set: The `ProcessSet` to reduce over. Defaults to
            `global_process_set`.

    Returns:
        A new tensor of `tensor`'s shape and dtype.

    Raises:
        HorovodInternalError: If the ranks' dtype, shape or op differ, or a
            rank failed; the message names the tensor and the ranks.

    Example:

    >>> total = hvd.allreduce(torch.ones(3), op=hvd.Sum)
    """
    op = _ops.resolve_op(op, average, "allreduce")
    wire, cctx = compression.compress(tensor)
    out = _Allreduce.apply(wire, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, cctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """`allreduce` in place (not differentiable): returns `tensor`, which
    holds the result."""
    return synchronize(_ops.allreduce_async_(tensor, average, name, op, prescale_factor,
                                             postscale_factor, process_set))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.scales = (prescale_factor, postscale_factor)
        return tuple(synchronize(_ops.grouped_allreduce_async(
            list(tensors), name=name, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=process_set)))

    @staticmethod
    def backward(ctx, *grads):
        pre, post = ctx.scales
        reduced = grouped_allreduce(list(grads), op=ctx.op, prescale_factor=pre,
                                    postscale_factor=post, process_set=ctx.process_set)
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """`allreduce` of a list of tensors as one group: one negotiation and
    one fused reduction. Differentiable. Returns a list of new tensors."""
    op = _ops.resolve_op(op, average, "grouped_allreduce")
    pairs = [compression.compress(t) for t in _ops.tensor_list(tensors, "grouped_allreduce")]
    outs = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                   *[w for w, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """`grouped_allreduce` in place; returns `tensors`."""
    return synchronize(_ops.grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set))


def _my_rows(grad, dims, process_set):
    """This rank's rows of a reduced allgather gradient, given every rank's
    first dimension."""
    set_rank = _sets.rank_size(_sets.resolve(process_set, "backward")[0])[0]
    offset = sum(dims[:set_rank])
    return grad.narrow(0, offset, dims[set_rank])


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.process_set = process_set
        ctx.dim = tensor.shape[0] if tensor.dim() else 0
        return synchronize(_ops.allgather_async(tensor, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=_ops.Average, process_set=ctx.process_set)
        dims = synchronize(_ops.allgather_async(
            torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.process_set)).tolist()
        return _my_rows(grad, dims, ctx.process_set), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's `tensor` along the first dimension, in rank
    order; the first dimension may differ across ranks, the others must
    match. Differentiable (the gradient is averaged over the ranks and this
    rank's rows are returned, as in Horovod)."""
    return _Allgather.apply(tensor, name, process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.process_set = process_set
        ctx.dims = [t.shape[0] if t.dim() else 0 for t in tensors]
        return tuple(synchronize(_ops.grouped_allgather_async(
            list(tensors), name=name, process_set=process_set)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce(list(grads), op=_ops.Average, process_set=ctx.process_set)
        dims = synchronize(_ops.allgather_async(
            torch.tensor([ctx.dims], dtype=torch.int64), process_set=ctx.process_set))
        return (None, None, *[_my_rows(g, dims[:, i].tolist(), ctx.process_set)
                              for i, g in enumerate(reduced)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """`allgather` of a list of tensors as one batch. Differentiable."""
    return list(_GroupedAllgather.apply(
        name, process_set, *_ops.tensor_list(tensors, "grouped_allgather")))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(_ops.broadcast_async(tensor, root_rank, name=name,
                                                process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=_ops.Average, process_set=ctx.process_set)
        if context.rank != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns `root_rank`'s `tensor` on every rank (a new tensor).
    `root_rank` is a rank of the whole job and a member of `process_set`.
    Differentiable (the gradient is averaged and kept on the root only)."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """`broadcast` in place: `tensor` receives the root's values and is
    returned."""
    return synchronize(_ops.broadcast_async_(tensor, root_rank, name, process_set))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(_ops.alltoall_async(tensor, splits, name=name,
                                                           process_set=process_set))
        ctx.process_set, ctx.received = process_set, received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = synchronize(_ops.alltoall_async(grad_output.contiguous(), ctx.received,
                                                  process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends `splits[j]` rows of `tensor` to rank j of the process set and
    returns the rows received from every rank, in rank order.

    Args:
        tensor: The rows to send (split along the first dimension).
        splits: Rows for each rank (a list or 1-D tensor of integers).
            Defaults to `None`: split evenly.
        name, process_set: As in `allreduce`.

    Returns:
        The received tensor; with `splits` given, as in Horovod, the tuple
        `(received, received_splits)`. Differentiable.
    """
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.factor = prescale_factor * postscale_factor
        return synchronize(_ops.reducescatter_async(
            tensor, name=name, op=op, process_set=process_set,
            prescale_factor=prescale_factor, postscale_factor=postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = grad_output * (ctx.factor * (_set_size(ctx.process_set)
                                            if ctx.op == _ops.Sum else 1))
        return allgather(grad, process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=_ops.Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the ranks (`Average` or `Sum`) and returns this
    rank's block of rows of the result (the first `dim0 % size` ranks get
    one row more). Differentiable."""
    wire, cctx = compression.compress(tensor)
    out = _Reducescatter.apply(wire, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, cctx)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.factor = prescale_factor * postscale_factor
        return tuple(synchronize(_ops.grouped_reducescatter_async(
            list(tensors), name=name, op=op, process_set=process_set,
            prescale_factor=prescale_factor, postscale_factor=postscale_factor)))

    @staticmethod
    def backward(ctx, *grads):
        scale = ctx.factor * (_set_size(ctx.process_set) if ctx.op == _ops.Sum else 1)
        gathered = grouped_allgather([g * scale for g in grads], process_set=ctx.process_set)
        return (None, None, None, None, None, *gathered)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=_ops.Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """`reducescatter` of a list of tensors as one batch. Differentiable."""
    pairs = [compression.compress(t)
             for t in _ops.tensor_list(tensors, "grouped_reducescatter")]
    outs = _GroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                       postscale_factor, *[w for w, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]
