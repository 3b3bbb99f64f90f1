"""`kerasdist.broadcast_variables` for every Keras backend."""

from kerasdist._keras import backend as _backend
from kerasdist.common.context import check_initialized


def _tensorflow_variables(variables):
    return _backend.is_tensorflow() or any(
        type(v).__module__.startswith("tensorflow") for v in variables)


def broadcast_variables(variables, root_rank=0, process_set=None, inplace=False, name=None):
    """Assigns `root_rank`'s values to `variables` on every rank.

    Args:
        variables: An iterable of Keras variables (or `tf.Variable`s), in
            the same order on every rank.
        root_rank: The rank whose values are kept. Defaults to 0.
        process_set: The `kerasdist.ProcessSet` to broadcast in. Defaults
            to `None` (all ranks).
        inplace: On TensorFlow, write the root's values straight into the
            variables' buffers (one fused op). Defaults to False.
        name: Prefix for the collectives' names. Defaults to `None`
            (numbered per call).

    Returns:
        `None` when executing eagerly. On TensorFlow, in a graph
        (`tf.function` or a `tf.compat.v1` graph), the op that performs the
        broadcast and the assignments, as in Horovod.

    Example:

    >>> kerasdist.broadcast_variables(model.variables, root_rank=0)  # doctest: +SKIP
    """
    check_initialized()
    variables = list(variables)
    if _tensorflow_variables(variables):
        from kerasdist.tensorflow.functions import broadcast_variables as tf_broadcast

        return tf_broadcast(variables, root_rank, process_set=process_set, inplace=inplace,
                            name=name)
    _backend.check_supported("broadcast_variables")
    return _backend.broadcast_variables(variables, root_rank, name=name,
                                        process_set=process_set)
