"""Collectives on variables and Python objects, built on the tensor ops."""

import cloudpickle
import numpy as np
import tensorflow as tf

from kerasdist import _first_update, ops
from kerasdist.runtime import check_initialized, context


def broadcast_variables(variables, root_rank=0, name=None):
    """Assigns `root_rank`'s values to `variables` on every rank.

    Args:
        variables: An iterable of `tf.Variable` or Keras variables, in the
            same order on every rank.
        root_rank: The rank whose values are kept. Defaults to 0.
        name: Prefix for the collectives' names. Defaults to `None`
            (numbered per call when eager, graph node names inside a
            `tf.function`, so several calls may be in flight together).
    """
    check_initialized()
    variables = list(variables)
    if name is None and not tf.executing_eagerly():
        prefix = None  # each op is named after its graph node: unique
    else:
        # Unique per call, so two calls in flight at once never collide.
        prefix = name or context.next_name("broadcast_variables")
    for i, var in enumerate(variables):
        value = ops.broadcast(tf.convert_to_tensor(var), root_rank,
                              name=f"{prefix}.{i}" if prefix else None)
        var.assign(value)
    _first_update.mark_broadcast(variables)


def broadcast_object(obj, root_rank=0, name=None):
    """Returns `root_rank`'s `obj` on every rank (pickled with cloudpickle).

    Inside a `tf.function` it runs when the function is traced (eagerly,
    through `tf.init_scope`), and the function sees the root's object as a
    trace-time constant: Python objects do not exist in a running graph.

    Args:
        obj: Any picklable object; only the root's value is used.
        root_rank: The sending rank. Defaults to 0.
        name: Name for the underlying collectives. Defaults to `None`.

    Returns:
        The root's object.

    Example:

    >>> config = kerasdist.broadcast_object({"lr": 0.1} if kerasdist.rank() == 0 else None)
    """
    check_initialized()
    if not tf.executing_eagerly():
        with tf.init_scope():
            return broadcast_object(obj, root_rank, name)
    name = name or context.next_name("broadcast_object")
    if context.rank == root_rank:
        payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    else:
        payload = np.zeros(0, dtype=np.uint8)
    length = ops.broadcast(tf.constant([payload.size], tf.int64), root_rank,
                           name=f"{name}.size")
    if context.rank != root_rank:
        payload = np.zeros(int(length[0]), dtype=np.uint8)
    data = ops.broadcast(tf.constant(payload), root_rank, name=f"{name}.data")
    if context.rank == root_rank:
        return obj
    return cloudpickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None):
    """Returns the list of every rank's `obj`, ordered by rank.

    Inside a `tf.function` it runs when the function is traced, like
    `broadcast_object`.

    Args:
        obj: Any picklable object.
        name: Name for the underlying collectives. Defaults to `None`.

    Returns:
        A list of `size()` objects, rank 0's first.

    Example:

    >>> hosts = kerasdist.allgather_object(socket.gethostname())
    """
    check_initialized()
    if not tf.executing_eagerly():
        with tf.init_scope():
            return allgather_object(obj, name)
    name = name or context.next_name("allgather_object")
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    sizes = ops.allgather(tf.constant([payload.size], tf.int64), name=f"{name}.size")
    data = ops.allgather(tf.constant(payload), name=f"{name}.data").numpy()
    out, offset = [], 0
    for n in sizes.numpy():
        out.append(cloudpickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return out
