"""kerasdist's collectives as XLA FFI custom calls, for `jax.jit`.

The handlers live in `libkerasdist_jax.so` (kerasdist/csrc/jax/ffi_ops.cc),
built against the FFI headers that jaxlib ships and linked to the engine
library, so JAX shares the one engine of the process. They are registered
once with the public `jax.ffi.register_ffi_target` and called with
`jax.ffi.ffi_call`; each is asynchronous (it returns an `ffi::Future`), so
XLA's threads never block on the network.

Only the public `jax` and `jax.ffi` APIs are used.
"""

import ctypes

import jax
import numpy as np

from kerasdist.common import library
from kerasdist.common.context import context

JAX_LIBRARY = "libkerasdist_jax.so"
_TARGETS = {
    "kerasdist_allreduce": "KerasdistAllreduce",
    "kerasdist_broadcast": "KerasdistBroadcast",
    "kerasdist_allgather": "KerasdistAllgather",
    "kerasdist_alltoall": "KerasdistAlltoall",
    "kerasdist_reducescatter": "KerasdistReducescatter",
}
_LOADED = []  # the ctypes library, once loaded and registered


def load():
    """Loads the FFI library and registers its handlers with XLA, once.

    Raises:
        ImportError: If the library was not built (JAX was not installed
            when kerasdist was built) or speaks another C API version.
    """
    if _LOADED:
        return _LOADED[0]
    path = library.find(JAX_LIBRARY, "JAX library")
    context.lib  # noqa: B018  (the engine library first: this one links it)
    lib = ctypes.CDLL(path)
    lib.kerasdist_jax_api_version.restype = ctypes.c_int32
    version = lib.kerasdist_jax_api_version()
    if version != library.API_VERSION:
        raise ImportError(
            f"kerasdist's JAX library {path} was built against C API version {version}, "
            f"but the engine library speaks version {library.API_VERSION}. "
            + library.REBUILD)
    for target, symbol in _TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)),
                                    platform="cpu")
    _LOADED.append(lib)
    return lib


def _call(target, results, *args, aliases=None, vmap="sequential", **attrs):
    load()
    # No side effect: JAX dispatches an effectful program through its slow
    # path (about 75 us more per call here). So XLA may drop a collective
    # whose result the program does not use: every caller uses its results
    # (a rank that does not would leave the others waiting until the
    # deadlock rule ends it, naming the tensor). Two collectives never merge:
    # their names differ.
    fn = jax.ffi.ffi_call(target, results, vmap_method=vmap, input_output_aliases=aliases)
    return fn(*args, **attrs)


def allreduce(xs, name, op, set_id, prescale, postscale):
    """One custom call reducing every array of `xs` (a group when several)."""
    results = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]
    out = _call("kerasdist_allreduce", results, *xs,
                aliases={i: i for i in range(len(xs))}, vmap="broadcast_all",
                name=name, op=np.int64(op), process_set=np.int64(set_id),
                prescale=float(prescale), postscale=float(postscale))
    return list(out)


def broadcast(x, name, root, set_id):
    return _call("kerasdist_broadcast", jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                 aliases={0: 0}, vmap="broadcast_all", name=name, root=np.int64(root),
                 process_set=np.int64(set_id))


def allgather(x, name, set_id, set_size):
    shape = (x.shape[0] * set_size,) + tuple(x.shape[1:])
    return _call("kerasdist_allgather", jax.ShapeDtypeStruct(shape, x.dtype), x,
                 name=name, process_set=np.int64(set_id))


def alltoall(x, name, set_id):
    return _call("kerasdist_alltoall", jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                 name=name, process_set=np.int64(set_id))


def reducescatter(x, rows, name, op, set_id, prescale, postscale):
    shape = (rows,) + tuple(x.shape[1:])
    return _call("kerasdist_reducescatter", jax.ShapeDtypeStruct(shape, x.dtype), x,
                 name=name, op=np.int64(op), process_set=np.int64(set_id),
                 prescale=float(prescale), postscale=float(postscale))
