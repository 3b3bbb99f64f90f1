"""Horovod's remaining collectives, on the kerasdist engine: reducescatter,
alltoall, grouped allgather and the in-place broadcast of variables.

Like the collectives in ops.py, each is a TensorFlow op that works
eagerly and inside `tf.function`, matched across ranks by name. The ranks'
arguments are checked against each other before anything moves: a mismatch
(shape, dtype, op, splits) fails the collective on every rank with a
`tf.errors.FailedPreconditionError` that names what each rank sent (a rank
whose own alltoall splits are invalid gets `InvalidArgumentError`), and the
engine goes on.
"""

import tensorflow as tf

from kerasdist.common import process_sets as _sets
from kerasdist.common.context import check_initialized, context
from kerasdist.tensorflow import ops
from kerasdist.tensorflow._util import (Average, OP_NAMES, Sum, as_tensor, check_dtype, grad_name,
                                        tensor_name)
from kerasdist.common.broadcast_record import mark_broadcast
from kerasdist.tensorflow.compression import Compression
from kerasdist.tensorflow.library import raw_ops


def _check_scatter_op(op):
    op = Average if op is None else op
    if op not in (Average, Sum):
        raise ValueError(
            "Invalid value for argument `op` of `reducescatter`. Expected "
            "kerasdist.Average or kerasdist.Sum. Received: op="
            + OP_NAMES.get(op, repr(op)))
    return op


def _tensor_of_rank1(tensor, what):
    tensor = as_tensor(tensor, what)
    if tensor.shape.rank == 0:
        raise ValueError(
            f"`{what}` requires tensors with at least one dimension. "
            "Received a scalar; reshape it to [1] first.")
    return tensor


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average,
                  name=None, process_set=None, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces a tensor over all ranks; each rank keeps its rows of the result.

    The first dimension is split as Horovod splits it: with `d` rows and `n`
    ranks, every rank gets `d // n` rows and the first `d % n` ranks one more,
    in rank order (`d = 5, n = 3`: 2, 2, 1 rows).

    Args:
        tensor: A tensor with at least one dimension, of the same shape and
            dtype on every rank.
        device_dense: Unused (CPU only). Defaults to `""`.
        compression: `Compression.none`, `fp16` or `bf16`, applied to the
            wire only. Defaults to `Compression.none`.
        op: `kerasdist.Average` or `kerasdist.Sum`. Defaults to `Average`.
            Integer averages truncate toward zero.
        name: Name that matches this collective across ranks. Defaults to
            `None` (derived from call order or the graph node name).
        process_set: The `kerasdist.ProcessSet` to reduce over (rows are
            split among its ranks, in order). Defaults to `None` (all).
        ignore_name_scope: Accepted for Horovod compatibility; kerasdist
            matches graph ops by their full node name. Defaults to False.
        prescale_factor: Multiplies the input before the reduction.
            Defaults to 1.0.
        postscale_factor: Multiplies the result after the reduction.
            Defaults to 1.0.

    Returns:
        This rank's rows of the reduced tensor: the input's shape with the
        first dimension divided as above.

    Raises:
        RuntimeError: If kerasdist is not initialized.
        ValueError: For an `op` other than `Average` or `Sum`, or a scalar.
        TypeError: For an unsupported dtype.
        tf.errors.FailedPreconditionError: At run time, on every rank, when
            the ranks' shape, dtype, op or factors differ.

    The gradient is Horovod's: the allgather of the incoming gradients,
    multiplied by `size()` for `Sum` (and by the scale factors).

    Example:

    >>> rows = kerasdist.reducescatter(tf.ones([5, 2]), op=kerasdist.Sum)
    """
    check_initialized()
    set_id, _ = _sets.resolve(process_set, "reducescatter")
    del device_dense, ignore_name_scope
    op = _check_scatter_op(op)
    tensor = _tensor_of_rank1(tensor, "reducescatter")
    wire, ctx = compression.compress(tensor)
    out = raw_ops().kerasdist_reducescatter(
        wire, reduce_op=op, prescale_factor=float(prescale_factor),
        postscale_factor=float(postscale_factor),
        tensor_name=tensor_name("reducescatter", name, set_id), process_set_id=set_id)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none,
                          op=Average, process_set=None, prescale_factor=1.0,
                          postscale_factor=1.0, name=None):
    """Reducescatters a list of tensors in one op; the engine fuses them.

    The tensors reach the engine together and those of one dtype travel in
    one ring pass, also when called eagerly.

    Args:
        tensors: A list of tensors, each at least 1-D (dtypes may differ).
        device_dense, compression, op, process_set, prescale_factor,
            postscale_factor: As in `reducescatter`.
        name: Prefix for the tensors' names; tensor i is `"{name}.{i}"`.
            Defaults to `None`.

    Returns:
        A list with this rank's rows of each reduced tensor, in order.

    Example:

    >>> a, b = kerasdist.grouped_reducescatter([tf.ones([4]), tf.ones([3, 2])])
    """
    check_initialized()
    set_id, _ = _sets.resolve(process_set, "grouped_reducescatter")
    del device_dense
    op = _check_scatter_op(op)
    tensors = [_tensor_of_rank1(t, "grouped_reducescatter") for t in tensors]
    if not tensors:
        return []
    wires, ctxs = zip(*[compression.compress(t) for t in tensors])
    outs = raw_ops().kerasdist_grouped_reducescatter(
        list(wires), reduce_op=op, prescale_factor=float(prescale_factor),
        postscale_factor=float(postscale_factor),
        tensor_name=tensor_name("grouped_reducescatter", name, set_id),
        process_set_id=set_id)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Sends slices of a tensor to every rank and concatenates what arrives.

    Rank i sends rows `[sum(splits[:j]), sum(splits[:j + 1]))` of its
    tensor to rank j; the result on rank j is the rows from rank 0, then
    rank 1, and so on. The first dimension and the splits may differ
    between ranks; the dtype and the other dimensions must agree.

    Args:
        tensor: A tensor with at least one dimension.
        splits: `size()` non-negative integers (a list or 1-D int tensor)
            that sum to `tensor`'s first dimension: how many rows go to each
            rank. Defaults to `None`: an even split, which needs a first
            dimension divisible by `size()`.
        name: Name that matches this collective across ranks. Defaults to
            `None`.
        ignore_name_scope: Accepted for Horovod compatibility. Defaults to
            False.
        process_set: The `kerasdist.ProcessSet` to exchange in (`splits`
            has one entry per member, in rank order). Defaults to `None`.

    Returns:
        As Horovod's TensorFlow API: with `splits`, a tuple `(tensor,
        received_splits)`, where `received_splits` (int32, one entry per
        rank) counts the rows that came from each rank; without `splits`,
        only the tensor.

    Raises:
        RuntimeError: If kerasdist is not initialized.
        ValueError: For a scalar tensor or splits that are not 1-D.
        TypeError: For an unsupported dtype or non-integer splits.
        tf.errors.InvalidArgumentError: At run time, on a rank whose own
            splits are invalid (wrong length, negative, not summing to its
            first dimension, or none and a first dimension not divisible by
            the size), as in Horovod. The message names each bad rank's
            splits.
        tf.errors.FailedPreconditionError: At run time, on the other ranks
            when some rank's splits are invalid (every rank fails together,
            none waits), or on every rank when the ranks' dtypes or trailing
            dimensions differ.

    Its gradient sends the incoming gradient back along the way it came
    (an alltoall with the received splits).

    Example:

    >>> out, received = kerasdist.alltoall(tf.range(3), splits=[1, 2])  # doctest: +SKIP
    """
    check_initialized()
    set_id, _ = _sets.resolve(process_set, "alltoall")
    del ignore_name_scope
    tensor = _tensor_of_rank1(tensor, "alltoall")
    if splits is None:
        wire_splits = tf.constant([], tf.int32)
    else:
        wire_splits = tf.convert_to_tensor(splits)
        if not wire_splits.dtype.is_integer:
            raise TypeError(
                "Invalid dtype for argument `splits` of `alltoall`. Expected "
                f"integers. Received: dtype={wire_splits.dtype.name}")
        if wire_splits.shape.rank not in (None, 1):
            raise ValueError(
                "Invalid value for argument `splits` of `alltoall`. Expected a "
                f"1-D list of {_sets.rank_size(set_id)[1]} integers. Received shape "
                f"{wire_splits.shape}")
        wire_splits = tf.cast(wire_splits, tf.int32)
    out, received = raw_ops().kerasdist_alltoall(
        tensor, wire_splits, tensor_name=tensor_name("alltoall", name, set_id),
        process_set_id=set_id)
    return (out, received) if splits is not None else out


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=None):
    """Allgathers a list of tensors in one op.

    Each tensor is concatenated along its first dimension, which may differ
    between ranks, as in `allgather`.

    Args:
        tensors: A list of tensors, each at least 1-D (dtypes may differ).
        name: Prefix for the tensors' names; tensor i is `"{name}.{i}"`.
            Defaults to `None`.
        ignore_name_scope: Accepted for Horovod compatibility. Defaults to
            False.
        process_set: The `kerasdist.ProcessSet` to gather over. Defaults to
            `None` (all ranks).

    Returns:
        A list of gathered tensors, in the order of `tensors`.

    Example:

    >>> rows, ids = kerasdist.grouped_allgather([tf.ones([2, 3]), tf.range(2)])
    """
    check_initialized()
    set_id, _ = _sets.resolve(process_set, "grouped_allgather")
    del ignore_name_scope
    tensors = [_tensor_of_rank1(t, "grouped_allgather") for t in tensors]
    if not tensors:
        return []
    return list(raw_ops().kerasdist_grouped_allgather(
        tensors, tensor_name=tensor_name("grouped_allgather", name, set_id),
        process_set_id=set_id))


def _resource_variable(var):
    if isinstance(var, tf.Variable):
        return var
    inner = getattr(var, "value", None)  # a Keras variable wraps a tf.Variable
    if isinstance(inner, tf.Variable):
        return inner
    raise TypeError(
        "Invalid value in argument `variables` of `broadcast_`. Expected "
        f"tf.Variable or Keras variables. Received: {type(var).__name__}")


def broadcast_(variables, root_rank, name=None, process_set=None):
    """Overwrites `variables`, in place, with `root_rank`'s values.

    The engine writes straight into each variable's buffer (a buffer that a
    tensor read earlier still shares is copied first, so that tensor keeps
    its value). All variables go to the engine together.

    Args:
        variables: `tf.Variable`s or Keras variables, in the same order and
            with the same shapes and dtypes on every rank.
        root_rank: The rank whose values are kept (in `process_set`).
        name: Prefix for the collectives' names; variable i is
            `"{name}.{i}"`. Defaults to `None`.
        process_set: The `kerasdist.ProcessSet` to broadcast in. Defaults
            to `None` (all ranks).

    Returns:
        The variables' new values, as tensors, in order.

    Raises:
        RuntimeError: If kerasdist is not initialized.
        ValueError: For an invalid `root_rank`.
        TypeError: For something that is not a variable, or an unsupported
            dtype.

    Example:

    >>> kerasdist.broadcast_(model.trainable_variables, root_rank=0)  # doctest: +SKIP
    """
    check_initialized()
    set_id, root = _sets.set_root(root_rank, process_set, "broadcast_")
    originals = list(variables)
    resources = [_resource_variable(v) for v in originals]
    if not resources:
        return []
    for v in resources:
        check_dtype(v, "broadcast_")
    op = raw_ops().kerasdist_broadcast_inplace(
        [v.handle for v in resources], root_rank=root,
        tensor_name=tensor_name("broadcast_", name, set_id), process_set_id=set_id)
    mark_broadcast(originals)
    if tf.executing_eagerly():
        return [v.read_value() for v in resources]
    with tf.control_dependencies([op]):
        return [v.read_value() for v in resources]


# Gradients, with Horovod's conventions (see ops.py).


@tf.RegisterGradient("KerasdistReducescatter")
def _reducescatter_grad(op, grad):
    return _scale_scatter_grad(op, ops.allgather(grad, name=grad_name(op, "grad"),
                                                 process_set=_op_set(op)))


@tf.RegisterGradient("KerasdistGroupedReducescatter")
def _grouped_reducescatter_grad(op, *grads):
    grads = [tf.zeros_like(y) if g is None else g for g, y in zip(grads, op.outputs)]
    gathered = grouped_allgather(grads, name=grad_name(op, "grad"), process_set=_op_set(op))
    return [_scale_scatter_grad(op, g) for g in gathered]


def _scale_scatter_grad(op, grad):
    """Horovod's reducescatter gradient is the allgathered upstream gradient,
    times size() for Sum; kerasdist also applies the scale factors."""
    scale = op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
    if op.get_attr("reduce_op") == Sum:
        scale *= _sets.rank_size(op.get_attr("process_set_id"))[1]
    return grad if scale == 1.0 else grad * tf.cast(scale, grad.dtype)


@tf.RegisterGradient("KerasdistAlltoall")
def _alltoall_grad(op, grad, _received_splits_grad):
    grad, _ = alltoall(grad, splits=op.outputs[1], name=grad_name(op, "grad"),
                       process_set=_op_set(op))
    return [grad, None]


@tf.RegisterGradient("KerasdistGroupedAllgather")
def _grouped_allgather_grad(op, *grads):
    grads = [tf.zeros_like(y) if g is None else g for g, y in zip(grads, op.outputs)]
    ps = _op_set(op)
    rank, size = _sets.rank_size(op.get_attr("process_set_id"))
    reduced = ops.grouped_allreduce(grads, op=Average, name=grad_name(op, "grad"),
                                    process_set=ps)
    dims = [tf.shape(x, out_type=tf.int64)[:1] for x in op.inputs]
    sizes = grouped_allgather(dims, name=grad_name(op, "grad_sizes"), process_set=ps)
    return [tf.split(g, s, num=size, axis=0)[rank] for g, s in zip(reduced, sizes)]


def _op_set(op):
    return _sets.by_id(op.get_attr("process_set_id"))


tf.no_gradient("KerasdistBroadcastInplace")
