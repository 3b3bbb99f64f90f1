"""Horovod's run-time query ops.

`rank_op()` and friends are TensorFlow ops (`KerasdistQuery`, a small
kernel that reads the live context when it runs), so inside a
`tf.function` they give the values at run time, not at trace time: a
function traced before `shutdown()` and `init(comm=...)` on another
communicator reads the new rank and size.

`size_op` and `process_set_included_op` take a process set, by id or as a
`kerasdist.ProcessSet`.
"""

from kerasdist.common.context import check_initialized
from kerasdist.common.queries import checked_set_id
from kerasdist.tensorflow.library import raw_ops

_RANK, _LOCAL_RANK, _SIZE, _LOCAL_SIZE, _INCLUDED = range(5)


def _query(kind, name, set_id=0):
    check_initialized()
    return raw_ops().kerasdist_query(query=kind, name=name, process_set_id=set_id)


def rank_op(name=None):
    """Returns this process's rank as an int32 scalar tensor, read when the
    op runs.

    Args:
        name: The op's name. Defaults to `None`.

    Returns:
        A scalar `tf.int32` tensor.

    Example:

    >>> @tf.function
    ... def f():
    ...     return kerasdist.rank_op()
    """
    return _query(_RANK, name)


def local_rank_op(name=None):
    """Returns this process's rank on its host as an int32 scalar tensor,
    read when the op runs.

    Args:
        name: The op's name. Defaults to `None`.

    Returns:
        A scalar `tf.int32` tensor.
    """
    return _query(_LOCAL_RANK, name)


def size_op(process_set_id=0, name=None, process_set=None):
    """Returns the number of processes (in a process set) as an int32
    scalar tensor, read when the op runs.

    Args:
        process_set_id: The set's id; 0 is every process. Defaults to 0.
        name: The op's name. Defaults to `None`.
        process_set: The `kerasdist.ProcessSet`, instead of its id.
            Defaults to `None`.

    Returns:
        A scalar `tf.int32` tensor.
    """
    return _query(_SIZE, name, checked_set_id(process_set_id, process_set))


def local_size_op(name=None):
    """Returns the number of processes on this host as an int32 scalar
    tensor, read when the op runs.

    Args:
        name: The op's name. Defaults to `None`.

    Returns:
        A scalar `tf.int32` tensor.
    """
    return _query(_LOCAL_SIZE, name)


def process_set_included_op(process_set_id=0, name=None, process_set=None):
    """Returns 1 (int32 scalar tensor) if this process is in the process set,
    else 0.

    Args:
        process_set_id: The set's id; 0 is every process. Defaults to 0.
        name: The op's name. Defaults to `None`.
        process_set: The `kerasdist.ProcessSet`, instead of its id.
            Defaults to `None`.

    Returns:
        A scalar `tf.int32` tensor.
    """
    return _query(_INCLUDED, name, checked_set_id(process_set_id, process_set))
