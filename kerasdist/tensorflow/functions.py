"""Collectives on variables, built on the tensor ops; and the collectives on
Python objects, which are the framework-neutral runtime's
(kerasdist/common/objects.py) with Horovod's TensorFlow signatures."""

import tensorflow as tf

from kerasdist.common import process_sets as _sets
from kerasdist.common.context import check_initialized, context
from kerasdist.common.objects import allgather_object, broadcast_object  # noqa: F401
from kerasdist.tensorflow import ops
from kerasdist.common.broadcast_record import mark_broadcast
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

    Returns:
        `None` when executing eagerly; in a graph (`tf.function` or a
        `tf.compat.v1` graph), the op that performs the broadcast and the
        assignments, as in Horovod: run it (`session.run(op)`) in a
        `tf.compat.v1` graph, where nothing runs unless fetched.

    Example:

    >>> kerasdist.broadcast_variables(model.variables, root_rank=0)  # doctest: +SKIP
    """
    check_initialized()
    variables = list(variables)
    if inplace:
        values = broadcast_(variables, root_rank, name=name, process_set=process_set)
        return None if tf.executing_eagerly() else tf.group(*values)
    if name is None and not tf.executing_eagerly():
        prefix = None  # each op is named after its graph node: unique
    else:
        # Unique per call, so two calls in flight at once never collide.
        prefix = name or _next_name("broadcast_variables", process_set, "broadcast_variables")
    assigns = []
    for i, var in enumerate(variables):
        value = ops.broadcast(tf.convert_to_tensor(var), root_rank,
                              name=f"{prefix}.{i}" if prefix else None,
                              process_set=process_set)
        assigns.append(var.assign(value))
    mark_broadcast(variables)
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_global_variables(root_rank):
    """Broadcasts a `tf.compat.v1` graph's global variables from `root_rank`.

    Horovod's TensorFlow 1 API: it broadcasts
    `tf.compat.v1.global_variables()` and returns the op to run. In eager
    execution there is no collection of global variables, so, as in
    Horovod, it raises; broadcast the model's and optimizer's variables
    with `broadcast_variables` instead (`kerasdist.keras` has a Keras
    `broadcast_global_variables`).

    Args:
        root_rank: The rank whose values are kept.

    Returns:
        The op that broadcasts and assigns the variables.

    Raises:
        RuntimeError: When executing eagerly, or if kerasdist is not
            initialized.
        ValueError: For an invalid `root_rank`.

    Example:

    >>> with tf.compat.v1.Session() as sess:
    ...     sess.run(tf.compat.v1.global_variables_initializer())
    ...     sess.run(kerasdist.broadcast_global_variables(0))
    """
    check_initialized()
    if tf.executing_eagerly():
        raise RuntimeError(
            "kerasdist.broadcast_global_variables() does not support eager "
            "execution, as in Horovod: there is no collection of global "
            "variables. Use `kerasdist.broadcast_variables(<model/optimizer "
            "variables>, root_rank)` instead.")
    _sets.set_root(root_rank, None, "broadcast_global_variables")  # also with no variables
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)
