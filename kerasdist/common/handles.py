"""Collectives through the engine library's C API, for any framework.

A binding describes its tensors as `Request` structs (buffers, dtype,
shape, op) and calls `enqueue()`, which returns a `Handle` to wait on. The
framework-neutral runtime uses this for objects and barriers; the PyTorch
and JAX bindings build their collectives on it.
"""

import ctypes
import time

import numpy as np

from kerasdist.common import library
from kerasdist.common.context import check_initialized, context
from kerasdist.common.exceptions import HorovodInternalError

# The C API's codes (csrc/capi/kerasdist.h).
ALLREDUCE, ALLGATHER, BROADCAST, BARRIER, JOIN, REDUCESCATTER, ALLTOALL = range(7)
OK, INVALID_ARGUMENT, MISMATCH, TIMEOUT, ABORTED, SHUTDOWN, INTERNAL, PRECONDITION = range(8)
PENDING = -1
# The engine recognizes a join by its op; every binding uses this one name.
JOIN_NAME = "__kerasdist_join__"

_DTYPES = {
    np.dtype(np.float16): 0, np.dtype(np.float32): 2, np.dtype(np.float64): 3,
    np.dtype(np.int32): 4, np.dtype(np.int64): 5, np.dtype(np.uint8): 6,
    np.dtype(np.int8): 7, np.dtype(np.uint16): 8, np.dtype(np.int16): 9,
    np.dtype(np.bool_): 10,
}


def dtype_code(dtype):
    """The C API's code for a numpy dtype (bfloat16 by its name)."""
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return 1
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(
            "Unsupported dtype for a kerasdist collective. Expected one of "
            "float16, bfloat16, float32, float64, int8, int16, int32, int64, "
            f"uint8, uint16, bool. Received: dtype={dtype}") from None


class CollectiveError(HorovodInternalError):
    """A collective failed at run time; `code` is the C API's status code
    (`MISMATCH`, `TIMEOUT`, `ABORTED`, `SHUTDOWN`, `INTERNAL`,
    `PRECONDITION`)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def raise_for(code, message):
    """Raises the Python error for a failed collective's `code`."""
    if code == INVALID_ARGUMENT:
        raise ValueError(message)
    if code == PRECONDITION and "not initialized" in message:
        raise RuntimeError(message)
    raise CollectiveError(code, message)


class Handle:
    """A batch enqueued with `enqueue()`: wait on it, then read its outputs.

    The handle keeps the batch's buffers (and `keep`) alive until it has
    completed, and releases the C handle when it is garbage collected.
    """

    def __init__(self, ptr, keep):
        self._ptr = ptr
        self._keep = keep

    def poll(self):
        """Returns True once the batch has completed."""
        return bool(context.lib.kerasdist_handle_poll(self._ptr))

    def wait(self):
        """Waits for the batch; raises if it failed.

        The engine bounds every collective, so this returns or raises within
        the engine's timeouts; it wakes every 100 ms so that a signal (e.g.
        Ctrl-C) is handled.
        """
        lib = context.lib
        while True:
            code = lib.kerasdist_handle_wait(self._ptr, 100)
            if code != PENDING:
                break
            time.sleep(0)  # let Python run signal handlers
        if code != OK:
            buf = ctypes.create_string_buffer(4096)
            lib.kerasdist_handle_status(self._ptr, buf, len(buf))
            raise_for(code, buf.value.decode(errors="replace"))
        return self

    def shape(self, index=0):
        """Request `index`'s output shape (after `wait()`)."""
        dims = (ctypes.c_int64 * 32)()
        ndim = context.lib.kerasdist_handle_shape(self._ptr, index, dims, 32)
        if ndim < 0:
            raise RuntimeError(f"kerasdist: no output shape for request {index}")
        return tuple(dims[:ndim])

    def output(self, index, dtype):
        """Copies request `index`'s output that the handle holds (allgather,
        alltoall without an allocator) into a new numpy array."""
        out = np.empty(self.shape(index), dtype=dtype)
        rc = context.lib.kerasdist_handle_copy_output(
            self._ptr, index, out.ctypes.data_as(ctypes.c_void_p), out.nbytes)
        if rc != 0:
            raise RuntimeError(f"kerasdist: copying the output of request {index} failed")
        return out

    def received_splits(self, index=0):
        """An alltoall's rows received from each rank of its process set."""
        capacity = max(context.size or 1, 1)  # a process set is at most the job
        out = (ctypes.c_int32 * capacity)()
        n = context.lib.kerasdist_handle_received_splits(self._ptr, index, out, capacity)
        return list(out[:max(n, 0)])

    def join_result(self):
        return context.lib.kerasdist_handle_join_result(self._ptr)

    def __del__(self):
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr and context.lib is not None:
            context.lib.kerasdist_handle_release(ptr)


def request(op, name, array=None, output=None, process_set_id=0, reduce_op=1, root=0,
            prescale=1.0, postscale=1.0, splits=None):
    """A `kerasdist_request` for numpy `array` (C-contiguous) and `output`.

    Returns the struct and the objects that must stay alive with it.
    """
    if array is None:
        r, keep = raw_request(op, name, process_set_id=process_set_id, reduce_op=reduce_op,
                              root=root, prescale=prescale, postscale=postscale,
                              splits=splits)
    else:
        r, keep = raw_request(
            op, name, dtype_code(array.dtype), array.shape, array.ctypes.data,
            None if output is None else output.ctypes.data, process_set_id=process_set_id,
            reduce_op=reduce_op, root=root, prescale=prescale, postscale=postscale,
            splits=splits)
        keep.append(array)
    if output is not None:
        keep.append(output)
    return r, keep


def raw_request(op, name, dtype=0, shape=(), input_ptr=None, output_ptr=None,
                process_set_id=0, reduce_op=1, root=0, prescale=1.0, postscale=1.0,
                splits=None):
    """A `kerasdist_request` for buffers given by address.

    Args:
        op: The C API's op code (`ALLREDUCE`, ...).
        name: The collective's name (str or bytes), equal on every rank.
        dtype: The C API's dtype code (`dtype_code()`).
        shape: The tensor's shape (a scalar is `()`).
        input_ptr, output_ptr: The buffers' addresses (ints), or `None`. The
            caller keeps the buffers alive until the handle completes.
        process_set_id, reduce_op, root, prescale, postscale, splits: As in
            the C API's `kerasdist_request`.

    Returns:
        The struct and the ctypes objects that must stay alive with it.
    """
    r = library.Request()
    r.struct_size = ctypes.sizeof(library.Request)
    r.op = op
    r.name = name.encode() if isinstance(name, str) else name
    r.process_set = process_set_id
    r.reduce_op = reduce_op
    r.prescale, r.postscale = prescale, postscale
    r.root = root
    keep = [r.name]
    if input_ptr is not None or output_ptr is not None or shape:
        dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        r.dtype = dtype
        r.ndim = len(shape)
        r.shape = dims
        r.input = ctypes.c_void_p(input_ptr or None)
        keep.append(dims)
    if output_ptr is not None:
        r.output = ctypes.c_void_p(output_ptr or None)
    if splits is not None:
        s = (ctypes.c_int64 * max(len(splits), 1))(*splits)
        r.nsplits, r.splits = len(splits), s
        keep.append(s)
    return r, keep


def enqueue(requests, group_name=None):
    """Enqueues `(struct, keep)` pairs as one batch; returns its `Handle`."""
    check_initialized()
    structs = (library.Request * len(requests))(*[r for r, _ in requests])
    keep = [k for _, k in requests] + [structs]
    ptr = context.lib.kerasdist_enqueue(
        structs, len(requests), group_name.encode() if group_name else None, 0, None, None)
    return Handle(ptr, keep)


def barrier(name="barrier", process_set_id=0):
    """Waits until every rank of the process set has called it."""
    enqueue([request(BARRIER, name, process_set_id=process_set_id)]).wait()


def allgather_bytes(data, name, process_set_id=0):
    """Every rank's `data` (bytes), in rank order, over the process set."""
    blob = np.frombuffer(data, dtype=np.uint8)
    length = np.array([blob.size], dtype=np.int64)
    handle = enqueue([
        request(ALLGATHER, f"{name}.length", length, process_set_id=process_set_id),
        request(ALLGATHER, f"{name}.data", blob, process_set_id=process_set_id),
    ]).wait()
    lengths = handle.output(0, np.int64).tolist()
    gathered = handle.output(1, np.uint8).tobytes()
    out, offset = [], 0
    for n in lengths:
        out.append(gathered[offset:offset + n])
        offset += n
    return out


def broadcast_bytes(data, root_rank, name, process_set_id=0):
    """`root_rank`'s `data` (bytes; ignored elsewhere) on every rank.

    `root_rank` is a rank within the process set (the engine's numbering).
    """
    set_rank = context.rank
    if process_set_id:
        set_rank = context.process_sets[process_set_id].ranks.index(context.rank)
    root = set_rank == root_rank
    length = np.array([len(data) if root else 0], dtype=np.int64)
    enqueue([request(BROADCAST, f"{name}.length", length, length,
                     process_set_id=process_set_id, root=root_rank)]).wait()
    buf = (np.frombuffer(data, dtype=np.uint8).copy() if root
           else np.empty(int(length[0]), dtype=np.uint8))
    enqueue([request(BROADCAST, f"{name}.data", buf, buf,
                     process_set_id=process_set_id, root=root_rank)]).wait()
    return buf.tobytes()
