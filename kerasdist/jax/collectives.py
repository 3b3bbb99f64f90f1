"""kerasdist's collectives on JAX arrays, eagerly and inside `jax.jit`.

Outside `jax.jit` a collective runs at once through the engine library's C
API (kerasdist/common/handles.py) and returns a new array; `allgather` and
`alltoall` then take pieces of any size. Inside `jax.jit` it is an XLA FFI
custom call (kerasdist/jax/_ffi.py) that XLA runs asynchronously; there,
`allgather` and `alltoall` need pieces of equal size on every rank.

Collectives are matched across ranks by name. Give the same `name` on every
rank, or leave it `None` and issue the same sequence of unnamed calls (and
traces) on every rank. A jitted function runs the same named collectives
each time it is called.

The collectives are differentiable (`jax.custom_vjp`), with Horovod's
gradients:
- allreduce: the gradient is allreduced with the same op and scale factors;
- allgather: the gradient is averaged over the ranks and this rank's rows
  are taken;
- broadcast: the gradient is averaged over the ranks and kept on the root
  only (zeros elsewhere);
- alltoall: the gradient goes back with an alltoall;
- reducescatter: the gradient is allgathered (times the set's size for
  `Sum`, times the scale factors).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kerasdist.common import handles as _h
from kerasdist.common import process_sets as _sets
from kerasdist.common.context import check_initialized, context
from kerasdist.common.process_sets import global_process_set
from kerasdist.common.reduce_ops import OP_NAMES, Average, Max, Min, Sum
from kerasdist.jax import _ffi

_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
           "uint8", "uint16", "bool")
# Moved, never computed on: JAX's PRNG keys are uint32.
_MOVE_ONLY = {"uint32": np.int32, "uint64": np.int64}


def _traced(x):
    return isinstance(x, jax.core.Tracer)


def _array(x):
    return x if _traced(x) or isinstance(x, jax.Array) else jnp.asarray(x)


def _check(x, what, op=None):
    """Checks `x`'s dtype for `what`; `op` is given for reductions."""
    name = jnp.dtype(x.dtype).name
    if name in _DTYPES or (op is None and name in _MOVE_ONLY):
        if op is not None and name == "bool" and op not in (Min, Max):
            raise ValueError(
                f"`{what}` of bool arrays takes op=Min or op=Max only. Received: "
                f"op={OP_NAMES.get(op, op)}")
        return
    allowed = ", ".join(_DTYPES + (() if op is not None else tuple(_MOVE_ONLY)))
    raise TypeError(f"Unsupported dtype for `{what}`. Expected one of {allowed}. "
                    f"Received: dtype={name}")


def _op(op, what):
    if isinstance(op, bool) or op not in OP_NAMES or OP_NAMES[op] == "Adasum":
        raise ValueError(f"Invalid value for argument `op` of `{what}`. Expected one of "
                         "kerasdist.jax.Average, Sum, Min, Max, Product. Received: "
                         f"op={op!r}")
    return op


def _name(kind, name, set_id, traced):
    if name is None:
        # Inside jit a name is baked into the program, so it never repeats,
        # and it has its own counter: an eager call (whose names cycle) can
        # never take the name of a jitted one still queued or in flight.
        kind = f"jax.{kind}" + (".jit" if traced else "") + (f".set{set_id}" if set_id else "")
        return context.next_name(kind, pooled=not traced)
    if not isinstance(name, str) or not name:
        raise TypeError("Invalid value for argument `name`. Expected a non-empty str or "
                        f"None. Received: name={name!r}")
    return name


def _host(x):
    """A C-contiguous numpy copy of a concrete array, moved as a signed
    integer of its width if it is unsigned 32/64-bit."""
    a = np.array(x, copy=True, order="C")
    kind = _MOVE_ONLY.get(a.dtype.name)
    return (a.view(kind), a.dtype) if kind else (a, a.dtype)


def _set_size(set_id):
    return _sets.rank_size(set_id)[1]


# ---- The two paths of each collective (no gradient). ----

def _allreduce_impl(xs, name, op, set_id, pre, post):
    if any(_traced(x) for x in xs):
        return _ffi.allreduce(list(xs), name, op, set_id, pre, post)
    inputs = [np.array(x, copy=True, order="C") for x in xs]
    grouped = len(inputs) > 1
    reqs = [_h.request(_h.ALLREDUCE, f"{name}.{i}" if grouped else name, a, a,
                       process_set_id=set_id, reduce_op=op, prescale=float(pre),
                       postscale=float(post)) for i, a in enumerate(inputs)]
    _h.enqueue(reqs, group_name=name if grouped else None).wait()
    return [jnp.asarray(a) for a in inputs]


def _broadcast_impl(x, name, root, set_id):
    if _traced(x):
        return _ffi.broadcast(x, name, root, set_id)
    a, dtype = _host(x)
    _h.enqueue([_h.request(_h.BROADCAST, name, a, a, process_set_id=set_id,
                           root=root)]).wait()
    return jnp.asarray(a.view(dtype))


def _allgather_impl(x, name, set_id):
    if _traced(x):
        return _ffi.allgather(x, name, set_id, _set_size(set_id))
    a, dtype = _host(x)
    handle = _h.enqueue([_h.request(_h.ALLGATHER, name, a, process_set_id=set_id)]).wait()
    return jnp.asarray(handle.output(0, a.dtype).view(dtype))


def _alltoall_impl(x, splits, name, set_id):
    if _traced(x):
        size = _set_size(set_id)
        if splits is not None:
            raise ValueError(f"alltoall '{name}' inside `jax.jit` splits the first dimension "
                             "evenly; `splits` works outside `jax.jit` only.")
        if x.shape[0] % size:
            raise ValueError(
                f"alltoall '{name}' inside `jax.jit` sends equal pieces, so the first "
                f"dimension ({x.shape[0]}) must be divisible by the process set's size "
                f"({size}). Call it outside `jax.jit` for pieces of different sizes.")
        return _ffi.alltoall(x, name, set_id), None
    a, dtype = _host(x)
    handle = _h.enqueue([_h.request(_h.ALLTOALL, name, a, process_set_id=set_id,
                                    splits=splits)]).wait()
    out = jnp.asarray(handle.output(0, a.dtype).view(dtype))
    return out, jnp.asarray(handle.received_splits(0), dtype=jnp.int32)


def _rows(dim0, set_id):
    rank, size = _sets.rank_size(set_id)
    return _block_rows(rank, size, dim0)


def _reducescatter_impl(x, name, op, set_id, pre, post):
    if x.ndim < 1:
        raise ValueError(f"reducescatter '{name}' requires an array with at least one "
                         "dimension. Received a scalar; reshape it to [1].")
    rows = _rows(x.shape[0], set_id)
    if _traced(x):
        return _ffi.reducescatter(x, rows, name, op, set_id, pre, post)
    a = np.array(x, copy=True, order="C")
    out = np.empty((rows,) + a.shape[1:], dtype=a.dtype)
    _h.enqueue([_h.request(_h.REDUCESCATTER, name, a, out, process_set_id=set_id,
                           reduce_op=op, prescale=float(pre), postscale=float(post))]).wait()
    return jnp.asarray(out)


# ---- Differentiable forms. ----

@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5))
def _allreduce_d(xs, name, op, set_id, pre, post):
    return tuple(_allreduce_impl(xs, name, op, set_id, pre, post))


def _allreduce_fwd(xs, name, op, set_id, pre, post):
    return _allreduce_d(xs, name, op, set_id, pre, post), None


def _allreduce_bwd(name, op, set_id, pre, post, _, grads):
    # Integer outputs have float0 cotangents (no gradient): left as they are.
    real = [i for i, g in enumerate(grads) if g.dtype != jax.dtypes.float0]
    out = list(grads)
    if real:
        reduced = _allreduce_impl([grads[i] for i in real], name + ".grad", op, set_id, pre, post)
        for i, r in zip(real, reduced):
            out[i] = r
    return (tuple(out),)


_allreduce_d.defvjp(_allreduce_fwd, _allreduce_bwd)


def _my_rows(grad, dim0, set_id, name):
    """This rank's rows of an averaged allgather gradient."""
    rank, size = _sets.rank_size(set_id)
    if _traced(grad):
        offset = rank * dim0  # equal pieces inside jit
    else:
        dims = np.asarray(_allgather_impl(jnp.asarray([dim0], jnp.int64), name + ".dims",
                                          set_id))
        offset = int(dims[:rank].sum())
    return jax.lax.slice_in_dim(grad, offset, offset + dim0, axis=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _allgather_d(x, name, set_id):
    return _allgather_impl(x, name, set_id)


def _allgather_fwd(x, name, set_id):
    # The residual's shape carries this rank's first dimension.
    return _allgather_d(x, name, set_id), jnp.zeros((x.shape[0], 0), jnp.float32)


def _allgather_bwd(name, set_id, residual, grad):
    avg = _allreduce_impl([grad], name + ".grad", Average, set_id, 1.0, 1.0)[0]
    return (_my_rows(avg, residual.shape[0], set_id, name + ".grad"),)


_allgather_d.defvjp(_allgather_fwd, _allgather_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _broadcast_d(x, name, root, root_in_job, set_id):
    return _broadcast_impl(x, name, root, set_id)


def _broadcast_fwd(x, name, root, root_in_job, set_id):
    return _broadcast_d(x, name, root, root_in_job, set_id), None


def _broadcast_bwd(name, root, root_in_job, set_id, _, grad):
    avg = _allreduce_impl([grad], name + ".grad", Average, set_id, 1.0, 1.0)[0]
    # `* 0` as Horovod: the result stays used (XLA keeps the allreduce that
    # the root's program needs) and becomes zeros.
    return (avg if context.rank == root_in_job else avg * jnp.zeros((), avg.dtype),)


_broadcast_d.defvjp(_broadcast_fwd, _broadcast_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _alltoall_d(x, splits, name, set_id):
    return _alltoall_impl(x, splits, name, set_id)


def _alltoall_fwd(x, splits, name, set_id):
    out, received = _alltoall_d(x, splits, name, set_id)
    return (out, received), received


def _alltoall_bwd(splits, name, set_id, received, cotangents):
    grad = cotangents[0]
    back = None if received is None else tuple(int(r) for r in np.asarray(received))
    return (_alltoall_impl(grad, back, name + ".grad", set_id)[0],)


_alltoall_d.defvjp(_alltoall_fwd, _alltoall_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5))
def _reducescatter_d(x, name, op, set_id, pre, post):
    return _reducescatter_impl(x, name, op, set_id, pre, post)


def _reducescatter_fwd(x, name, op, set_id, pre, post):
    # The residual's shape carries the input's first dimension.
    return (_reducescatter_d(x, name, op, set_id, pre, post),
            jnp.zeros((x.shape[0], 0), jnp.float32))


def _block_rows(q, size, dim0):
    """Rank q's rows of a reducescatter of `dim0` rows over `size` ranks."""
    return dim0 // size + (1 if q < dim0 % size else 0)


def _reducescatter_bwd(name, op, set_id, pre, post, residual, grad):
    scale = pre * post * (_set_size(set_id) if op == Sum else 1)
    grad = grad * jnp.asarray(scale, grad.dtype)
    if not _traced(grad):
        return (_allgather_impl(grad, name + ".grad", set_id),)
    # Inside jit the allgather takes equal pieces: pad every rank's block to
    # the largest (rank 0's), gather, and keep each rank's own rows.
    size, dim0 = _set_size(set_id), residual.shape[0]
    most = _block_rows(0, size, dim0)
    padded = jnp.pad(grad, [(0, most - grad.shape[0])] + [(0, 0)] * (grad.ndim - 1))
    gathered = _allgather_impl(padded, name + ".grad", set_id)
    pieces = [jax.lax.slice_in_dim(gathered, q * most, q * most + _block_rows(q, size, dim0))
              for q in range(size)]
    return (jnp.concatenate(pieces, axis=0),)


_reducescatter_d.defvjp(_reducescatter_fwd, _reducescatter_bwd)


# ---- The public API. ----

def _prepare(what, process_set):
    check_initialized()
    return _sets.resolve(process_set, what)[0]


def grouped_allreduce(tensors, op=Average, name=None, process_set=global_process_set,
                      prescale_factor=1.0, postscale_factor=1.0):
    """Reduces a list of arrays over the ranks as one group: one negotiation
    and one fused reduction (one custom call inside `jax.jit`).

    Args:
        tensors: A list of arrays, of the same shapes and dtypes on every rank.
        op: `Average`, `Sum`, `Min`, `Max` or `Product`. Defaults to
            `Average`. Integer averages truncate toward zero.
        name: The group's name, the same on every rank. Defaults to `None`.
        process_set: The `ProcessSet` to reduce over. Defaults to
            `global_process_set`.
        prescale_factor, postscale_factor: Multiply the input before and the
            result after the reduction. Default to 1.0.

    Returns:
        A list of new arrays. Differentiable.
    """
    set_id = _prepare("grouped_allreduce", process_set)
    op = _op(op, "grouped_allreduce")
    xs = tuple(_array(t) for t in tensors)
    if not xs:
        return []
    for x in xs:
        _check(x, "grouped_allreduce", op)
    traced = any(_traced(x) for x in xs)
    name = _name("grouped_allreduce", name, set_id, traced)
    # Concrete inputs carry no gradient: skip custom_vjp's eager overhead.
    fn = _allreduce_d if traced else _allreduce_impl
    return list(fn(xs, name, op, set_id, float(prescale_factor), float(postscale_factor)))


def allreduce(tensor, op=Average, name=None, process_set=global_process_set,
              prescale_factor=1.0, postscale_factor=1.0):
    """Reduces an array over the ranks; every rank receives the result.

    Args:
        tensor: An array of the same shape and dtype on every rank.
        op, name, process_set, prescale_factor, postscale_factor: As in
            `grouped_allreduce`.

    Returns:
        A new array of `tensor`'s shape and dtype. Differentiable.

    Example:
    >>> total = kd.allreduce(jnp.ones(3), op=kd.Sum)  # doctest: +SKIP
    """
    set_id = _prepare("allreduce", process_set)
    op = _op(op, "allreduce")
    x = _array(tensor)
    _check(x, "allreduce", op)
    name = _name("allreduce", name, set_id, _traced(x))
    fn = _allreduce_d if _traced(x) else _allreduce_impl
    return fn((x,), name, op, set_id, float(prescale_factor), float(postscale_factor))[0]


def _is_key(x):
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns `root_rank`'s array on every rank.

    Args:
        tensor: An array of the same shape and dtype on every rank (only the
            root's contents count). PRNG keys (typed or uint32) travel too.
        root_rank: The sending rank, a rank of the whole job and a member of
            `process_set`.
        name, process_set: As in `allreduce`.

    Returns:
        A new array. Differentiable (the gradient is averaged and kept on the
        root only).
    """
    set_id = _prepare("broadcast", process_set)
    _, root = _sets.set_root(root_rank, process_set, "broadcast")
    x = _array(tensor)
    if _is_key(x):
        impl = jax.random.key_impl(x)
        data = broadcast(jax.random.key_data(x), root_rank, name, process_set)
        return jax.random.wrap_key_data(data, impl=impl)
    _check(x, "broadcast")
    name = _name("broadcast", name, set_id, _traced(x))
    if not _traced(x):
        return _broadcast_impl(x, name, root, set_id)
    return _broadcast_d(x, name, root, root_rank, set_id)


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's array along the first dimension, in rank
    order.

    Outside `jax.jit` the first dimension may differ across ranks; inside,
    it must be the same on every rank (a clear error on every rank if not).
    The other dimensions must match. PRNG keys travel too.

    Returns:
        A new array. Differentiable (the gradient is averaged over the ranks
        and this rank's rows are returned).
    """
    set_id = _prepare("allgather", process_set)
    x = _array(tensor)
    if _is_key(x):
        impl = jax.random.key_impl(x)
        data = allgather(jax.random.key_data(x), name, process_set)
        return jax.random.wrap_key_data(data, impl=impl)
    _check(x, "allgather")
    if x.ndim < 1:
        raise ValueError("allgather requires an array with at least one dimension. "
                         "Received a scalar; reshape it to [1].")
    name = _name("allgather", name, set_id, _traced(x))
    return (_allgather_d if _traced(x) else _allgather_impl)(x, name, set_id)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends `splits[j]` rows of `tensor` to rank j of the process set and
    returns the rows received from every rank, in rank order.

    Args:
        tensor: The rows to send (split along the first dimension).
        splits: Rows for each rank (a list of integers), outside `jax.jit`
            only. Defaults to `None`: split evenly.
        name, process_set: As in `allreduce`.

    Returns:
        The received array; with `splits` given, as in Horovod, the tuple
        `(received, received_splits)`. Differentiable.
    """
    set_id = _prepare("alltoall", process_set)
    x = _array(tensor)
    _check(x, "alltoall")
    if x.ndim < 1:
        raise ValueError("alltoall requires an array with at least one dimension. "
                         "Received a scalar; reshape it to [1].")
    if splits is not None:
        splits = tuple(int(s) for s in np.asarray(splits).reshape(-1))
    name = _name("alltoall", name, set_id, _traced(x))
    out, received = (_alltoall_d if _traced(x) else _alltoall_impl)(x, splits, name, set_id)
    return out if splits is None else (out, received)


def reducescatter(tensor, op=Average, name=None, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the ranks (`Average` or `Sum`) and returns this
    rank's block of rows of the result (the first `dim0 % size` ranks get
    one row more). Differentiable."""
    set_id = _prepare("reducescatter", process_set)
    if op not in (Average, Sum):
        raise ValueError("Invalid value for argument `op` of `reducescatter`. Expected "
                         f"kerasdist.jax.Average or Sum. Received: op={op!r}")
    x = _array(tensor)
    _check(x, "reducescatter", op)
    name = _name("reducescatter", name, set_id, _traced(x))
    fn = _reducescatter_d if _traced(x) else _reducescatter_impl
    return fn(x, name, op, set_id, float(prescale_factor), float(postscale_factor))


def barrier(process_set=global_process_set):
    """Waits until every rank of the process set has called it. Runs
    outside `jax.jit` only."""
    set_id = _prepare("barrier", process_set)
    _h.barrier(context.next_name("jax.barrier" + (f".set{set_id}" if set_id else "")),
               set_id)
