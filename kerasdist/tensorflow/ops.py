"""Collective operations on tensors, backed by the kerasdist engine.

Every collective is a TensorFlow op that works eagerly and inside
`tf.function`. Collectives are matched across ranks by name: give the same
`name` on every rank, or leave it `None` and issue the same sequence of calls
on every rank (eager) or build the same graph (`tf.function`, where the op's
node name is used).
"""

import warnings

import tensorflow as tf

from kerasdist.common import process_sets as _sets
from kerasdist.common.context import check_initialized, context
from kerasdist.tensorflow._util import (  # noqa: F401  (public: the reduce ops, check_not_xla)
    OP_NAMES, SUPPORTED_DTYPES, Adasum, Average, Max, Min, Product, Sum, as_tensor,
    check_not_xla, grad_name, tensor_name)
from kerasdist.tensorflow.compression import Compression
from kerasdist.tensorflow.library import raw_ops


def _check_op(op):
    if op not in OP_NAMES:
        raise ValueError(
            "Invalid value for argument `op`. Expected one of kerasdist.Average, "
            "Sum, Min, Max, Product, Adasum (0-5). Received: op=" + repr(op)
        )


def _derived(name, suffix):
    return f"{name}.{suffix}" if name else None


def _resolve_op(op, average, what):
    """Horovod's deprecated `average=` argument mapped onto `op`."""
    if isinstance(op, bool) and average is None:
        # Horovod's second positional argument is `average`: a bool here is
        # that, never an op (True would otherwise equal Sum's value, 1).
        op, average = None, op
    if average is None:
        return Average if op is None else op
    if op is not None:
        raise ValueError(
            f"`{what}` takes `op` or the deprecated `average`, not both. "
            f"Received: op={op!r}, average={average!r}"
        )
    warnings.warn(
        f"The `average` argument of `{what}` is deprecated, as in Horovod. "
        "Use `op=kerasdist.Average` (average=True) or `op=kerasdist.Sum` "
        "(average=False) instead.",
        DeprecationWarning, stacklevel=3)
    return Average if average else Sum


def allreduce(
    tensor,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    compression=Compression.none,
    sparse_as_dense=False,
    average=None,
    device_dense="",
    device_sparse="",
    process_set=None,
    ignore_name_scope=False,
):
    """Reduces a tensor over all ranks; every rank receives the result.

    Args:
        tensor: A tensor (or `tf.IndexedSlices`) of a supported dtype.
        op: `kerasdist.Average`, `Sum`, `Min`, `Max`, `Product` or
            `Adasum`. Defaults to `None` (`Average`). Integer averages
            truncate toward zero. `Adasum` is the adaptive sum of Maleki et
            al. (the sum of orthogonal tensors, the average of parallel
            ones), for floating-point tensors on a power-of-two number of
            ranks.
        name: Name that matches this collective across ranks. Defaults to
            `None` (derived from call order or the graph node name).
        prescale_factor: Multiplies the input before the reduction.
            Defaults to 1.0.
        postscale_factor: Multiplies the result after the reduction.
            Defaults to 1.0.
        compression: `Compression.none`, `fp16` or `bf16`, applied to the wire
            only. Defaults to `Compression.none`.
        sparse_as_dense: For `tf.IndexedSlices`, densify and allreduce instead
            of allgathering values and indices. Defaults to False.
        average: Deprecated (as in Horovod): True means `op=Average`, False
            `op=Sum`; warns with a `DeprecationWarning`. Give `op` or
            `average`, not both. Defaults to `None`.
        device_dense, device_sparse: Unused (CPU only); accepted for Horovod
            compatibility. Default to `""`.
        process_set: The `kerasdist.ProcessSet` to reduce over (this rank
            must be in it). Defaults to `None` (`global_process_set`).
        ignore_name_scope: Unused; accepted for Horovod compatibility.
            Defaults to False.

    Returns:
        A tensor with the same shape and dtype as `tensor` (a
        `tf.IndexedSlices` for one, unless `sparse_as_dense`).

    Raises:
        RuntimeError: If kerasdist is not initialized.
        ValueError: For an invalid `op`, or both `op` and `average`.
        NotImplementedError: For `tf.IndexedSlices` (without
            `sparse_as_dense`) with `Min`, `Max`, `Product` or `Adasum`,
            or with a pre- or postscale factor other than 1, as in Horovod.
        TypeError: For an unsupported dtype.
        tf.errors.FailedPreconditionError: At run time, when the ranks'
            dtype, shape or op for this name differ (the message names the
            tensor and what each rank sent), or for `Adasum` on a number of
            ranks that is not a power of two or an integer dtype.

    Example:

    >>> kerasdist.allreduce(tf.constant([1.0, 2.0]), op=kerasdist.Sum)  # doctest: +SKIP
    """
    check_initialized()
    del device_dense, device_sparse, ignore_name_scope
    op = _resolve_op(op, average, "allreduce")
    _check_op(op)
    set_id, _ = _sets.resolve(process_set, "allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        if sparse_as_dense:
            tensor = tf.convert_to_tensor(tensor)
        else:
            return _allreduce_sparse(tensor, op, name, prescale_factor,
                                     postscale_factor, process_set)
    tensor = as_tensor(tensor, "allreduce")
    wire, ctx = compression.compress(tensor)
    out = raw_ops().kerasdist_allreduce(
        wire,
        reduce_op=op,
        prescale_factor=float(prescale_factor),
        postscale_factor=float(postscale_factor),
        tensor_name=tensor_name("allreduce", name, set_id),
        process_set_id=set_id,
    )
    return compression.decompress(out, ctx)


def _allreduce_sparse(slices, op, name, prescale_factor, postscale_factor, process_set=None):
    """Allgathers the values and indices: the sum of the slices (values
    divided by the size for `Average`), without densifying."""
    if op == Adasum:
        raise NotImplementedError(
            "op=kerasdist.Adasum does not reduce tf.IndexedSlices (such as "
            "an Embedding's gradient). Pass `sparse_as_dense=True` (to the "
            "optimizer or to `allreduce`) to reduce them as dense tensors.")
    if op not in (Average, Sum):
        raise NotImplementedError(
            "Only op=kerasdist.Average and op=kerasdist.Sum are supported "
            f"for tf.IndexedSlices. Received: op={OP_NAMES[op]}. Pass "
            "`sparse_as_dense=True` to reduce them densely."
        )
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError(
            "`prescale_factor` and `postscale_factor` are not supported for "
            f"tf.IndexedSlices. Received: prescale_factor={prescale_factor!r}, "
            f"postscale_factor={postscale_factor!r}. Scale the values "
            "yourself, or pass `sparse_as_dense=True`."
        )
    values = allgather(slices.values, name=_derived(name, "values"), process_set=process_set)
    indices = allgather(slices.indices, name=_derived(name, "indices"), process_set=process_set)
    if op == Average:
        size = len(process_set.ranks) if process_set is not None else context.size
        values = values / tf.cast(size, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def grouped_allreduce(tensors, op=None, name=None, prescale_factor=1.0,
                      postscale_factor=1.0, compression=Compression.none,
                      sparse_as_dense=False, average=None, device_dense="",
                      device_sparse="", process_set=None):
    """Allreduces a list of tensors in one op; the engine fuses them.

    The dense tensors go to the engine together, so they are fused into few
    ring passes also when called eagerly. `tf.IndexedSlices` are reduced one
    by one as in `allreduce`.

    Args:
        tensors: A list of tensors (dtypes may differ).
        op, prescale_factor, postscale_factor, compression, sparse_as_dense,
            average, device_dense, device_sparse, process_set: As in
            `allreduce`.
        name: Prefix for the tensors' names; tensor i is `"{name}.{i}"`.
            Defaults to `None`.

    Returns:
        A list of reduced tensors, in the order of `tensors`.
    """
    check_initialized()
    op = _resolve_op(op, average, "grouped_allreduce")
    _check_op(op)
    set_id, _ = _sets.resolve(process_set, "grouped_allreduce")
    tensors = list(tensors)
    if not tensors:
        return []
    base = tensor_name("grouped_allreduce", name, set_id)
    results = [None] * len(tensors)
    dense, wires, ctxs = [], [], []
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            results[i] = allreduce(
                t, op, _derived(base, f"sparse.{i}"), prescale_factor,
                postscale_factor, compression, sparse_as_dense, process_set=process_set)
            continue
        t = as_tensor(t, "grouped_allreduce")
        wire, ctx = compression.compress(t)
        dense.append(i)
        wires.append(wire)
        ctxs.append(ctx)
    if dense:
        outs = raw_ops().kerasdist_grouped_allreduce(
            wires,
            reduce_op=op,
            prescale_factor=float(prescale_factor),
            postscale_factor=float(postscale_factor),
            tensor_name=base,
            process_set_id=set_id,
        )
        for i, out, ctx in zip(dense, outs, ctxs):
            results[i] = compression.decompress(out, ctx)
    return results


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Concatenates each rank's tensor along the first dimension.

    The first dimension may differ between ranks; the other dimensions and
    the dtype must agree.

    Args:
        tensor: A tensor with at least one dimension.
        name: Name that matches this collective across ranks. Defaults to
            `None`.
        ignore_name_scope: Unused; accepted for Horovod compatibility.
            Defaults to False.
        process_set: The `kerasdist.ProcessSet` to gather over, in the order
            of its ranks. Defaults to `None` (`global_process_set`).

    Returns:
        A tensor whose first dimension is the sum over ranks.
    """
    check_initialized()
    del ignore_name_scope
    set_id, _ = _sets.resolve(process_set, "allgather")
    tensor = as_tensor(tensor, "allgather")
    if tensor.shape.rank == 0:
        raise ValueError(
            "allgather requires a tensor with at least one dimension. "
            "Received a scalar; reshape it to [1] first."
        )
    return raw_ops().kerasdist_allgather(
        tensor, tensor_name=tensor_name("allgather", name, set_id), process_set_id=set_id
    )


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """Returns `root_rank`'s value of `tensor` on every rank.

    Args:
        tensor: A tensor of the same shape and dtype on every rank.
        root_rank: The rank whose value is sent (a rank of `init()`'s
            communicator, in `process_set`, as in Horovod).
        name: Name that matches this collective across ranks. Defaults to
            `None`.
        ignore_name_scope: Unused; accepted for Horovod compatibility.
            Defaults to False.
        process_set: The `kerasdist.ProcessSet` to broadcast in. Defaults
            to `None` (`global_process_set`).

    Returns:
        A tensor equal to the root's `tensor`.
    """
    check_initialized()
    del ignore_name_scope
    set_id, root = _sets.set_root(root_rank, process_set, "broadcast")
    tensor = as_tensor(tensor, "broadcast")
    return raw_ops().kerasdist_broadcast(
        tensor, root_rank=root, tensor_name=tensor_name("broadcast", name, set_id),
        process_set_id=set_id,
    )


def barrier(process_set=None, name=None):
    """Blocks until every rank (of `process_set`, default all) has called
    `barrier()`.

    Args:
        process_set: The `kerasdist.ProcessSet` to wait for (Horovod's first
            argument). Defaults to `None` (every rank).
        name: Name that matches this barrier across ranks. Defaults to
            `None` (numbered in call order).
    """
    check_initialized()
    set_id, _ = _sets.resolve(process_set, "barrier")
    raw_ops().kerasdist_barrier(tensor_name=tensor_name("barrier", name, set_id),
                                  process_set_id=set_id)


def join(device=""):
    """Declares that this rank has run out of data.

    Until every rank has joined, this rank takes part in the other ranks'
    collectives with zeros and is left out of their averages.

    Args:
        device: Unused (CPU only); accepted for Horovod compatibility.
            Defaults to `""`.

    Returns:
        The rank that joined last, as an int (a tensor inside `tf.function`).
    """
    check_initialized()
    del device
    check_not_xla("join")
    out = raw_ops().kerasdist_join(tensor_name="join")
    return int(out) if tf.executing_eagerly() else out


# Gradients, with Horovod's convention: allreduce's gradient is the allreduce
# (same op and factors) of the incoming gradients; allgather's and
# broadcast's are the *average* over ranks of the incoming gradients (this
# rank's slice of it for allgather, zero off the root for broadcast).


def _reduce_grad_args(op, kind):
    """The arguments that reduce the incoming gradients of an allreduce op."""
    reduce_op = op.get_attr("reduce_op")
    if reduce_op not in (Average, Sum):
        raise ValueError(
            f"{kind} is differentiable only for op=Average or op=Sum. "
            f"Received: op={OP_NAMES.get(reduce_op, reduce_op)}"
        )
    return dict(
        op=reduce_op,
        name=grad_name(op, "grad"),
        prescale_factor=op.get_attr("prescale_factor"),
        postscale_factor=op.get_attr("postscale_factor"),
        process_set=_sets.by_id(op.get_attr("process_set_id")),
    )


@tf.RegisterGradient("KerasdistAllreduce")
def _allreduce_grad(op, grad):
    return allreduce(grad, **_reduce_grad_args(op, "allreduce"))


@tf.RegisterGradient("KerasdistGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    grads = [tf.zeros_like(x) if g is None else g for g, x in zip(grads, op.inputs)]
    return grouped_allreduce(grads, **_reduce_grad_args(op, "grouped_allreduce"))


@tf.RegisterGradient("KerasdistAllgather")
def _allgather_grad(op, grad):
    set_id = op.get_attr("process_set_id")
    ps = _sets.by_id(set_id)
    rank, size = _sets.rank_size(set_id)
    grad = allreduce(grad, op=Average, name=grad_name(op, "grad"), process_set=ps)
    dim0 = tf.shape(op.inputs[0], out_type=tf.int64)[:1]
    sizes = allgather(dim0, name=grad_name(op, "grad_sizes"), process_set=ps)
    return tf.split(grad, sizes, num=size, axis=0)[rank]


@tf.RegisterGradient("KerasdistBroadcast")
def _broadcast_grad(op, grad):
    root = op.get_attr("root_rank")  # within the process set
    set_id = op.get_attr("process_set_id")
    grad = allreduce(grad, op=Average, name=grad_name(op, "grad"),
                     process_set=_sets.by_id(set_id))
    if _sets.rank_size(set_id)[0] == root:
        return grad
    # Zeros that read the allreduce's output (ZerosLike, where tf.zeros_like
    # makes a constant): else a tf.compat.v1 session skips it off the root.
    return tf.raw_ops.ZerosLike(x=grad)
