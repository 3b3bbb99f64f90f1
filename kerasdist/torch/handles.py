"""How kerasdist's PyTorch binding hands tensors to the engine and back.

Tensors go to the engine library's C API by address (`data_ptr()`); the
engine thread reads and writes them while the caller goes on. Each
asynchronous collective gets an integer handle, as in Horovod; the handle
table lives in the runtime's `context.pending`, and `synchronize(handle)`
waits, finishes the outputs (copies out what the negotiation sized, writes
a non-contiguous in-place tensor back) and returns them.
"""

import ctypes

import torch

from kerasdist.common import handles as _handles
from kerasdist.common.context import check_initialized, context

# The C API's dtype codes (csrc/capi/kerasdist.h).
_DTYPES = {
    torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3,
    torch.int32: 4, torch.int64: 5, torch.uint8: 6, torch.int8: 7, torch.int16: 9,
    torch.bool: 10,
}
if hasattr(torch, "uint16"):
    _DTYPES[torch.uint16] = 8

SUPPORTED = ("uint8, int8, int16, int32, int64, float16, bfloat16, float32, "
             "float64, bool")


def dtype_code(tensor, what):
    """The C API's code for `tensor`'s dtype; TypeError if unsupported."""
    code = _DTYPES.get(tensor.dtype)
    if code is None:
        raise TypeError(
            f"Unsupported dtype for `{what}`: {tensor.dtype}. kerasdist's "
            f"collectives take tensors of {SUPPORTED}.")
    return code


def check_tensor(tensor, what, argument="tensor"):
    """Checks that `tensor` is a dense CPU `torch.Tensor` of a supported
    dtype; returns its dtype code."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"Invalid type for argument `{argument}` of `{what}`. Expected a "
            f"torch.Tensor. Received: {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(
            f"`{what}` received a tensor on device {tensor.device}. kerasdist "
            "runs collectives on CPU tensors only (there is no GPU path yet): "
            "move it with `tensor.cpu()` first.")
    if tensor.layout != torch.strided:
        raise ValueError(
            f"`{what}` received a {tensor.layout} tensor. It takes dense tensors; "
            "for sparse gradients use `sparse_allreduce_async` or "
            "`DistributedOptimizer(..., sparse_as_dense=True)`.")
    return dtype_code(tensor, what)


def contiguous(tensor):
    """`tensor` itself if C-contiguous, else a contiguous copy."""
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def request(op, name, tensor, output=None, code=None, **kwargs):
    """A C API request for contiguous CPU `tensor` (and `output`)."""
    if code is None:
        code = dtype_code(tensor, name)
    return _handles.raw_request(
        op, name, code, tuple(tensor.shape),
        tensor.data_ptr() if tensor.numel() else None,
        None if output is None else (output.data_ptr() if output.numel() else 0),
        **kwargs)


class _Pending:
    """An entry of the handle table: the engine's handle, what must stay
    alive until it completes, and `finish(handle)` giving the result."""

    __slots__ = ("handle", "keep", "finish", "names", "own_fault")

    def __init__(self, handle, keep, finish, names, own_fault=None):
        self.handle, self.keep, self.finish, self.names = handle, keep, finish, names
        self.own_fault = own_fault


def _check_names(names):
    """Raises ValueError, before anything is enqueued, if a collective of
    one of `names` is still running on this rank (Horovod raises at once
    too; the engine alone would fail the new one when it sees it). Looks
    up each name's last handle only, so many pending handles cost
    nothing."""
    for name in names:
        entry = context.pending.get(context.pending_names.get(name))
        if entry is not None and name in entry.names and not entry.handle.poll():
            raise ValueError(
                f"A collective named {name!r} is already in flight on this rank. Names "
                "of concurrent collectives must be unique: synchronize the first one, or "
                "give another name.")


def discard(handle):
    """Forgets `handle` (its collective has completed or failed)."""
    entry = context.pending.pop(handle, None)
    if entry is not None:
        for name in entry.names:
            if context.pending_names.get(name) == handle:
                del context.pending_names[name]


def submit(requests, keep, finish, group_name=None, own_fault=None):
    """Enqueues `requests` (from `request()`) as one batch; returns its
    integer handle.

    `keep`: objects (tensors) the engine uses until the batch completes.
    `finish(handle)`: returns the batch's result once it succeeded.

    Errors the C API finds before enqueueing (this rank's bad input) raise
    here, at once, as `ValueError`. `own_fault`: a message when this rank's
    input is invalid in a way only the negotiation detects (alltoall
    splits); every rank then fails, and this one with `ValueError`.
    """
    check_initialized()
    names = [group_name] if group_name else [r.name.decode() for r, _ in requests if r.name]
    _check_names(names)
    handle = _handles.enqueue(requests, group_name=group_name)
    if handle.poll():
        code = context.lib.kerasdist_handle_status(handle._ptr, None, 0)
        if code == _handles.INVALID_ARGUMENT:
            handle.wait()  # raises ValueError with the C API's message
    context.next_handle += 1
    context.pending[context.next_handle] = _Pending(handle, keep, finish, names, own_fault)
    for name in names:
        context.pending_names[name] = context.next_handle
    return context.next_handle


def _entry(handle, what):
    entry = context.pending.get(handle)
    if entry is None:
        raise ValueError(
            f"Invalid value for argument `handle` of `{what}`. Expected a handle "
            "returned by an asynchronous kerasdist.torch collective and not yet "
            f"synchronized. Received: handle={handle!r}")
    return entry


def poll(handle):
    """Returns True once the collective of `handle` has completed, when
    `synchronize(handle)` returns without waiting.

    Args:
        handle: A handle returned by an asynchronous collective.
    """
    return _entry(handle, "poll").handle.poll()


def synchronize(handle):
    """Waits for the asynchronous collective of `handle`; returns its output.

    Every collective is bounded by the engine's timeouts, so this returns
    or raises within them.

    Args:
        handle: A handle returned by an asynchronous collective.

    Returns:
        The output tensor (a list for the grouped collectives; for
        `alltoall_async`, the output and the received splits).

    Raises:
        HorovodInternalError: If the collective failed at run time: the
            ranks disagree (dtype, shape, op, root), a rank failed or
            stopped, or a bound ran out. The message names the ranks.
    """
    entry = _entry(handle, "synchronize")
    try:
        entry.handle.wait()
    except _handles.CollectiveError as e:
        if entry.own_fault:
            raise ValueError(f"{entry.own_fault} ({e})") from None
        raise
    finally:
        discard(handle)
    return entry.finish(entry.handle)


def copy_output(handle, index, out):
    """Copies request `index`'s output held by `handle` into `out`."""
    nbytes = out.numel() * out.element_size()
    rc = context.lib.kerasdist_handle_copy_output(
        handle._ptr, index, ctypes.c_void_p(out.data_ptr() if nbytes else None), nbytes)
    if rc != 0:
        raise RuntimeError(f"kerasdist: copying the output of request {index} failed")
    return out


def held_output(handle, index, like):
    """A new tensor (dtype of `like`) with request `index`'s output."""
    out = torch.empty(handle.shape(index), dtype=like.dtype)
    return copy_output(handle, index, out)
