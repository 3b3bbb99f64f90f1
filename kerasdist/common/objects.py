"""`allgather_object` and `broadcast_object` without any framework.

Objects are pickled with cloudpickle and carried as uint8 tensors through
the engine library's C API (kerasdist/common/handles.py), so they work in a
process without TensorFlow, PyTorch or JAX, inside a traced function (they
run in Python, at trace time) and in graph mode.
"""

import ctypes

import cloudpickle

from kerasdist.common import handles
from kerasdist.common import process_sets as _sets
from kerasdist.common.context import check_initialized, context


def _name(kind, name, process_set, what):
    set_id, _ = _sets.resolve(process_set, what)
    if name is None:
        name = context.next_name(f"{kind}.set{set_id}" if set_id else kind)
    return name, set_id


def allgather_object(obj, session=None, name=None, process_set=None):
    """Returns a list of every rank's `obj`, in rank order.

    It runs at once, in Python, through the engine library: in a process
    with no framework, eagerly, inside a traced `tf.function` (when it is
    traced: the function sees the result as a constant) and in TensorFlow 1
    graph mode alike.

    Args:
        obj: A picklable (cloudpickle) Python object.
        session: Unused: the collective needs no session. Accepted for
            Horovod's TensorFlow signature. Defaults to `None`.
        name: The collective's name, the same on every rank. Defaults to
            `None` (numbered per call; every rank must then make the same
            sequence of unnamed calls).
        process_set: The `kerasdist.ProcessSet` to gather over. Defaults to
            `None` (all ranks).

    Returns:
        A list with one object per rank of the process set.

    Example:

    >>> hosts = kerasdist.allgather_object(socket.gethostname())  # doctest: +SKIP

    Raises:
        RuntimeError: If kerasdist is not initialized, or the collective
            fails on any rank (the message names the ranks involved).
    """
    del session
    check_initialized()
    name, set_id = _name("allgather_object", name, process_set, "allgather_object")
    return [cloudpickle.loads(b) for b in
            handles.allgather_bytes(cloudpickle.dumps(obj), name, set_id)]


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """Returns `root_rank`'s `obj` on every rank.

    It runs at once, in Python, like `allgather_object`.

    Args:
        obj: A picklable (cloudpickle) object; only the root's is used.
        root_rank: The rank whose object every rank receives. Defaults to 0.
        session: Unused, as for `allgather_object`. Defaults to `None`.
        name: The collective's name, the same on every rank. Defaults to
            `None` (numbered per call).
        process_set: The `kerasdist.ProcessSet` to broadcast in. Defaults
            to `None` (all ranks).

    Returns:
        The root's object (on the root, `obj` itself).

    Example:

    >>> config = kerasdist.broadcast_object({"lr": 0.1} if kerasdist.rank() == 0 else None)

    Raises:
        RuntimeError: If kerasdist is not initialized, or the collective
            fails on any rank.
    """
    del session
    check_initialized()
    set_id, set_root = _sets.set_root(root_rank, process_set, "broadcast_object")
    name, _ = _name("broadcast_object", name, process_set, "broadcast_object")
    root = context.rank == root_rank
    data = handles.broadcast_bytes(cloudpickle.dumps(obj) if root else b"", set_root, name,
                                   set_id)
    return obj if root else cloudpickle.loads(data)


def barrier(process_set=None, name=None):
    """Blocks until every rank (of `process_set`, default all) has called
    `barrier()`.

    Args:
        process_set: The `kerasdist.ProcessSet` to wait for (Horovod's first
            argument). Defaults to `None` (every rank).
        name: Name that matches this barrier across ranks. Defaults to
            `None` (numbered in call order).

    Raises:
        RuntimeError: If kerasdist is not initialized, or a rank never comes
            (after the engine's bounds, naming it).
    """
    check_initialized()
    name, set_id = _name("barrier", name, process_set, "barrier")
    handles.barrier(name, set_id)


def join():
    """Tells the other ranks this rank has no more data; returns the last
    rank to join, once every rank has joined.

    Until then, this rank takes part in the others' allreduces with zeros
    (and is left out of their averages).

    Raises:
        RuntimeError: If kerasdist is not initialized, or the collective
            fails on any rank.
    """
    check_initialized()
    last = ctypes.c_int32(-1)
    req, keep = handles.raw_request(handles.JOIN, handles.JOIN_NAME)
    req.join_result = ctypes.pointer(last)
    handles.enqueue([(req, keep + [last])]).wait()
    return int(last.value)
