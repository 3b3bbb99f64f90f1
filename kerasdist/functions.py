"""Collectives on variables and Python objects, built on the tensor ops."""

import cloudpickle
import numpy as np
import tensorflow as tf

from kerasdist import ops
from kerasdist.runtime import check_initialized, context


def broadcast_variables(variables, root_rank=0, name=None):
    """Assigns `root_rank`'s values to `variables` on every rank.

    Args:
        variables: An iterable of `tf.Variable` or Keras variables, in the
            same order on every rank.
        root_rank: The rank whose values are kept. Defaults to 0.
        name: Prefix for the collectives' names. Defaults to
            `"broadcast_variables"`.
    """
    check_initialized()
    prefix = name or "broadcast_variables"
    for i, var in enumerate(variables):
        value = ops.broadcast(tf.convert_to_tensor(var), root_rank,
                              name=f"{prefix}.{i}")
        var.assign(value)


def _eager_only(what):
    if not tf.executing_eagerly():
        raise RuntimeError(
            f"`{what}` works on Python objects and must run eagerly, not "
            "inside a `tf.function`."
        )


def broadcast_object(obj, root_rank=0, name=None):
    """Returns `root_rank`'s `obj` on every rank (pickled with cloudpickle).

    Args:
        obj: Any picklable object; only the root's value is used.
        root_rank: The sending rank. Defaults to 0.
        name: Name for the underlying collectives. Defaults to `None`.

    Returns:
        The root's object.
    """
    check_initialized()
    _eager_only("broadcast_object")
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

    Args:
        obj: Any picklable object.
        name: Name for the underlying collectives. Defaults to `None`.
    """
    check_initialized()
    _eager_only("allgather_object")
    name = name or context.next_name("allgather_object")
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    sizes = ops.allgather(tf.constant([payload.size], tf.int64), name=f"{name}.size")
    data = ops.allgather(tf.constant(payload), name=f"{name}.data").numpy()
    out, offset = [], 0
    for n in sizes.numpy():
        out.append(cloudpickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return out
