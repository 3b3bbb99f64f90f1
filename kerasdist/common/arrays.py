"""Allreduce and broadcast of numpy arrays, without any framework.

They run at once, in Python, through the engine library's C API
(kerasdist/common/handles.py). The Keras layer uses them on backends whose
tensors it reads as numpy: flags that every rank must agree on, metric
averages and variable broadcasts.
"""

import numpy as np

from kerasdist.common import handles
from kerasdist.common import process_sets as _sets
from kerasdist.common import reduce_ops
from kerasdist.common.context import check_initialized, context


def _name(kind, name, set_id):
    if name is None:
        return context.next_name(f"{kind}.set{set_id}" if set_id else kind)
    return name


def _contiguous(value):
    array = np.asarray(value)  # keeps a scalar 0-dimensional
    return array if array.flags.c_contiguous else array.copy(order="C")


def grouped_allreduce(values, op=reduce_ops.Average, name=None, process_set=None,
                      prescale_factor=1.0, postscale_factor=1.0):
    """Reduces each array over the ranks, in one batch.

    Args:
        values: A list of numpy arrays (or values `np.asarray` accepts), in
            the same order and of the same shapes and dtypes on every rank.
        op: One of `kerasdist.Average`, `Sum`, `Min`, `Max`, `Product`.
            Defaults to `Average`.
        name: The batch's name, the same on every rank. Defaults to `None`
            (numbered per call).
        process_set: The `kerasdist.ProcessSet` to reduce over. Defaults to
            `None` (every rank).
        prescale_factor, postscale_factor: Multiply the input and the
            result. Default to 1.0.

    Returns:
        A list of new numpy arrays, one per input.
    """
    check_initialized()
    if op not in reduce_ops.OP_NAMES or op == reduce_ops.Adasum:
        raise ValueError(
            "Invalid value for argument `op`. Expected one of kerasdist.Average, "
            f"Sum, Min, Max, Product. Received: op={op!r}")
    set_id, _ = _sets.resolve(process_set, "allreduce")
    name = _name("arrays.allreduce", name, set_id)
    inputs = [_contiguous(v) for v in values]
    outputs = [np.empty_like(a) for a in inputs]
    requests = [handles.request(handles.ALLREDUCE, f"{name}.{i}", a, out,
                                process_set_id=set_id, reduce_op=op,
                                prescale=float(prescale_factor),
                                postscale=float(postscale_factor))
                for i, (a, out) in enumerate(zip(inputs, outputs))]
    if requests:
        handles.enqueue(requests, group_name=name if len(requests) > 1 else None).wait()
    return outputs


def allreduce(value, op=reduce_ops.Average, name=None, process_set=None):
    """Reduces one array over the ranks; returns a new numpy array.

    Args:
        value: A numpy array or number, of the same shape and dtype on every
            rank.
        op: One of `kerasdist.Average`, `Sum`, `Min`, `Max`, `Product`.
            Defaults to `Average`.
        name: The collective's name, the same on every rank. Defaults to
            `None` (numbered per call).
        process_set: The `kerasdist.ProcessSet` to reduce over. Defaults to
            `None` (every rank).

    Returns:
        A numpy array of the value's shape and dtype.
    """
    return grouped_allreduce([value], op=op, name=name, process_set=process_set)[0]


def broadcast(values, root_rank, name=None, process_set=None):
    """Returns `root_rank`'s arrays on every rank, in one batch.

    Args:
        values: A list of numpy arrays, of the same shapes and dtypes on
            every rank (only the root's contents count).
        root_rank: The sending rank (a rank of the whole job).
        name: The batch's name, the same on every rank. Defaults to `None`
            (numbered per call).
        process_set: The `kerasdist.ProcessSet` to broadcast in. Defaults to
            `None` (every rank).

    Returns:
        A list of numpy arrays: the root's values.
    """
    check_initialized()
    set_id, set_root = _sets.set_root(root_rank, process_set, "broadcast")
    name = _name("arrays.broadcast", name, set_id)
    buffers = [np.array(v, copy=True, order="C") for v in values]
    requests = [handles.request(handles.BROADCAST, f"{name}.{i}", b, b,
                                process_set_id=set_id, root=set_root)
                for i, b in enumerate(buffers)]
    if requests:  # one batch; the engine groups allreduces only
        handles.enqueue(requests).wait()
    return buffers
