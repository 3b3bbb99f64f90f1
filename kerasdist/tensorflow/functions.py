"""Collectives on variables and Python objects, built on the tensor ops."""

import cloudpickle
import numpy as np
import tensorflow as tf

from kerasdist.common import process_sets as _sets
from kerasdist.common.context import check_initialized, context
from kerasdist.tensorflow import ops
from kerasdist.tensorflow.broadcast_record import mark_broadcast
from kerasdist.tensorflow.collectives import broadcast_


def _next_name(kind, process_set, what):
    set_id, _ = _sets.resolve(process_set, what)
    return context.next_name(f"{kind}.set{set_id}" if set_id else kind)


def broadcast_variables(variables, root_rank=0, process_set=None, inplace=False, name=None):
    """Assigns `root_rank`'s values to `variables` on every rank.

    Args:
        variables: An iterable of `tf.Variable` or Keras variables, in the
            same order on every rank.
        root_rank: The rank whose values are kept. Defaults to 0.
        name: Prefix for the collectives' names. Defaults to `None`
            (numbered per call when eager, graph node names inside a
            `tf.function`, so several calls may be in flight together).
        process_set: The `kerasdist.ProcessSet` to broadcast in. Defaults
            to `None` (all ranks).
        inplace: Write the root's values straight into the variables'
            buffers (`broadcast_`, one fused op) instead of assigning
            broadcast tensors. Defaults to False.
    """
    check_initialized()
    variables = list(variables)
    if inplace:
        broadcast_(variables, root_rank, name=name, process_set=process_set)
        return
    if name is None and not tf.executing_eagerly():
        prefix = None  # each op is named after its graph node: unique
    else:
        # Unique per call, so two calls in flight at once never collide.
        prefix = name or _next_name("broadcast_variables", process_set, "broadcast_variables")
    for i, var in enumerate(variables):
        value = ops.broadcast(tf.convert_to_tensor(var), root_rank,
                              name=f"{prefix}.{i}" if prefix else None,
                              process_set=process_set)
        var.assign(value)
    mark_broadcast(variables)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """Returns `root_rank`'s `obj` on every rank (pickled with cloudpickle).

    Inside a `tf.function` it runs when the function is traced (eagerly,
    through `tf.init_scope`), and the function sees the root's object as a
    trace-time constant: Python objects do not exist in a running graph.

    Args:
        obj: Any picklable object; only the root's value is used.
        root_rank: The sending rank. Defaults to 0.
        session: Unused (TensorFlow 2 has no sessions); accepted for Horovod
            compatibility. Defaults to `None`.
        name: Name for the underlying collectives. Defaults to `None`.
        process_set: The `kerasdist.ProcessSet` to broadcast in. Defaults
            to `None` (all ranks).

    Returns:
        The root's object.

    Example:

    >>> config = kerasdist.broadcast_object({"lr": 0.1} if kerasdist.rank() == 0 else None)
    """
    check_initialized()
    del session
    if not tf.executing_eagerly():
        with tf.init_scope():
            return broadcast_object(obj, root_rank, name=name, process_set=process_set)
    name = name or _next_name("broadcast_object", process_set, "broadcast_object")
    if context.rank == root_rank:
        payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    else:
        payload = np.zeros(0, dtype=np.uint8)
    length = ops.broadcast(tf.constant([payload.size], tf.int64), root_rank,
                           name=f"{name}.size", process_set=process_set)
    if context.rank != root_rank:
        payload = np.zeros(int(length[0]), dtype=np.uint8)
    data = ops.broadcast(tf.constant(payload), root_rank, name=f"{name}.data",
                         process_set=process_set)
    if context.rank == root_rank:
        return obj
    return cloudpickle.loads(data.numpy().tobytes())


def allgather_object(obj, session=None, name=None, process_set=None):
    """Returns the list of every rank's `obj`, ordered by rank.

    Inside a `tf.function` it runs when the function is traced, like
    `broadcast_object`.

    Args:
        obj: Any picklable object.
        session: Unused; accepted for Horovod compatibility. Defaults to
            `None`.
        name: Name for the underlying collectives. Defaults to `None`.
        process_set: The `kerasdist.ProcessSet` to gather over. Defaults to
            `None` (all ranks).

    Returns:
        A list of `size()` objects (the set's size), rank 0's first.

    Example:

    >>> hosts = kerasdist.allgather_object(socket.gethostname())
    """
    check_initialized()
    del session
    if not tf.executing_eagerly():
        with tf.init_scope():
            return allgather_object(obj, name=name, process_set=process_set)
    name = name or _next_name("allgather_object", process_set, "allgather_object")
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    sizes = ops.allgather(tf.constant([payload.size], tf.int64), name=f"{name}.size",
                          process_set=process_set)
    data = ops.allgather(tf.constant(payload), name=f"{name}.data",
                         process_set=process_set).numpy()
    out, offset = [], 0
    for n in sizes.numpy():
        out.append(cloudpickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return out
