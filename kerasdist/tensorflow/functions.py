"""Collectives on variables, built on the tensor ops; and the collectives on
Python objects, which are the framework-neutral runtime's
(kerasdist/common/objects.py) with Horovod's TensorFlow signatures."""

import tensorflow as tf

from kerasdist.common import process_sets as _sets
from kerasdist.common.context import check_initialized, context
from kerasdist.common.objects import allgather_object, broadcast_object  # noqa: F401
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
