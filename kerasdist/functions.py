"""Collectives on variables and Python objects, built on the tensor ops."""

import cloudpickle
import numpy as np
import tensorflow as tf

from kerasdist import _first_update, ops
from kerasdist import process_sets as _sets
from kerasdist.runtime import check_initialized, context


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

    >>> kerasdist.broadcast_variables(model.variables, root_rank=0)
    """
    check_initialized()
    variables = list(variables)
    if inplace:
        from kerasdist.collectives import broadcast_

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
    _first_update.mark_broadcast(variables)
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
    ops.set_root(root_rank, None, "broadcast_global_variables")  # also with no variables
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def _graph_session(session, what):
    """The session that runs a `tf.compat.v1` graph's object collectives."""
    sess = session or tf.compat.v1.get_default_session()
    if sess is None:
        raise ValueError(
            f"Invalid value for argument `session` of `{what}`. Expected a "
            "`tf.compat.v1.Session` (or a default session) when building a "
            "`tf.compat.v1` graph: the object's bytes are exchanged by running "
            "ops in it. Received: session=None")
    return sess


def _lifted_to_eager():
    """True if `tf.init_scope()` reaches eager execution (inside a
    `tf.function`), False in a `tf.compat.v1` graph."""
    with tf.init_scope():
        return tf.executing_eagerly()


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """Returns `root_rank`'s `obj` on every rank (pickled with cloudpickle).

    Inside a `tf.function` it runs when the function is traced (eagerly,
    through `tf.init_scope`), and the function sees the root's object as a
    trace-time constant: Python objects do not exist in a running graph.
    In a `tf.compat.v1` graph it adds the broadcasts to the graph and runs
    them in `session`, as Horovod does.

    Args:
        obj: Any picklable object; only the root's value is used.
        root_rank: The sending rank. Defaults to 0.
        session: The `tf.compat.v1.Session` that runs the broadcasts in a
            `tf.compat.v1` graph. Defaults to `None` (the default session;
            unused when executing eagerly or in a `tf.function`).
        name: Name for the underlying collectives. Defaults to `None`.
        process_set: The `kerasdist.ProcessSet` to broadcast in. Defaults
            to `None` (all ranks).

    Returns:
        The root's object.

    Raises:
        ValueError: In a `tf.compat.v1` graph without a session.

    Example:

    >>> config = kerasdist.broadcast_object({"lr": 0.1} if kerasdist.rank() == 0 else None)
    """
    check_initialized()
    if not tf.executing_eagerly() and _lifted_to_eager():
        with tf.init_scope():
            return broadcast_object(obj, root_rank, name=name, process_set=process_set)
    if tf.executing_eagerly():
        to_numpy = lambda t: t.numpy()  # noqa: E731
    else:
        to_numpy = _graph_session(session, "broadcast_object").run
    name = name or _next_name("broadcast_object", process_set, "broadcast_object")
    if context.rank == root_rank:
        payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    else:
        payload = np.zeros(0, dtype=np.uint8)
    length = to_numpy(ops.broadcast(tf.constant([payload.size], tf.int64), root_rank,
                                    name=f"{name}.size", process_set=process_set))
    if context.rank != root_rank:
        payload = np.zeros(int(length[0]), dtype=np.uint8)
    data = to_numpy(ops.broadcast(tf.constant(payload), root_rank, name=f"{name}.data",
                                  process_set=process_set))
    if context.rank == root_rank:
        return obj
    return cloudpickle.loads(data.tobytes())


def allgather_object(obj, session=None, name=None, process_set=None):
    """Returns the list of every rank's `obj`, ordered by rank.

    Inside a `tf.function` it runs when the function is traced, and in a
    `tf.compat.v1` graph it runs in `session`, like `broadcast_object`.

    Args:
        obj: Any picklable object.
        session: The `tf.compat.v1.Session` that runs the allgathers in a
            `tf.compat.v1` graph. Defaults to `None` (the default session;
            unused when executing eagerly or in a `tf.function`).
        name: Name for the underlying collectives. Defaults to `None`.
        process_set: The `kerasdist.ProcessSet` to gather over. Defaults to
            `None` (all ranks).

    Returns:
        A list of `size()` objects (the set's size), rank 0's first.

    Raises:
        ValueError: In a `tf.compat.v1` graph without a session.

    Example:

    >>> hosts = kerasdist.allgather_object(socket.gethostname())
    """
    check_initialized()
    if not tf.executing_eagerly() and _lifted_to_eager():
        with tf.init_scope():
            return allgather_object(obj, name=name, process_set=process_set)
    if tf.executing_eagerly():
        to_numpy = lambda t: t.numpy()  # noqa: E731
    else:
        to_numpy = _graph_session(session, "allgather_object").run
    name = name or _next_name("allgather_object", process_set, "allgather_object")
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    sizes = to_numpy(ops.allgather(tf.constant([payload.size], tf.int64), name=f"{name}.size",
                                   process_set=process_set))
    data = to_numpy(ops.allgather(tf.constant(payload), name=f"{name}.data",
                                  process_set=process_set))
    out, offset = [], 0
    for n in sizes:
        out.append(cloudpickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return out
