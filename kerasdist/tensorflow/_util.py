"""Helpers shared by the TensorFlow binding's collectives (ops.py and
collectives.py): the reduce ops, the supported dtypes, the argument
checks and the collectives' names."""

import weakref

import tensorflow as tf

from kerasdist.common.context import context

# The reduce ops, as the engine numbers them; public as kerasdist.Average, ...
from kerasdist.common.reduce_ops import (  # noqa: E402,F401
    OP_NAMES, Adasum, Average, Max, Min, Product, Sum)

SUPPORTED_DTYPES = (
    tf.float16, tf.bfloat16, tf.float32, tf.float64,
    tf.int32, tf.int64, tf.uint8, tf.int8, tf.uint16, tf.int16, tf.bool,
)
_SUPPORTED = frozenset(SUPPORTED_DTYPES)


def check_dtype(tensor, what):
    """Raises TypeError unless `tensor`'s dtype is one the engine moves."""
    if tensor.dtype not in _SUPPORTED:
        raise TypeError(
            f"Unsupported dtype for `{what}`. Expected one of "
            + ", ".join(d.name for d in SUPPORTED_DTYPES)
            + f". Received: dtype={tensor.dtype.name}"
        )


def as_tensor(value, what):
    """`value` as a tensor of a supported dtype (raises TypeError if not).

    A `tf.Tensor` is returned as it is: `tf.convert_to_tensor` costs more
    per eager call than a small collective itself (measured 12 us of 41).
    """
    tensor = value if isinstance(value, tf.Tensor) else tf.convert_to_tensor(value)
    check_dtype(tensor, what)
    return tensor


def in_xla_context():
    """True while tracing a function compiled with XLA (`jit_compile=True`).

    TensorFlow enters an XLA control-flow context on the calling graph while
    it traces such a function; there is no public query, so this reads the
    graphs' contexts defensively and answers False if they are unavailable.
    """
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        get = getattr(graph, "_get_control_flow_context", None)
        ctx = get() if get else None
        while ctx is not None:
            is_xla = getattr(ctx, "IsXLAContext", None)
            if is_xla and is_xla():
                return True
            ctx = getattr(ctx, "outer_context", None)
        graph = getattr(graph, "outer_graph", None)
    return False


def check_not_xla(kind, eager=None):
    """Raises ValueError inside a function compiled with XLA: it cannot run
    kerasdist's `kind` (a collective, or what reduces gradients)."""
    eager = tf.executing_eagerly() if eager is None else eager
    if not eager and in_xla_context():
        raise ValueError(
            f"kerasdist `{kind}` cannot run inside an XLA-compiled function "
            "(`jit_compile=True`): XLA compiles the step into one program and "
            "cannot call the collective engine. Run this step without XLA: use "
            "`tf.function(..., jit_compile=False)`, or "
            "`model.compile(..., jit_compile=False)` for Keras."
        )


def tensor_name(kind, name, set_id=0):
    """The `tensor_name` attribute of a `kind` collective on set `set_id`.

    A given `name` is used as it is; `None` is numbered in call order when
    eager (`Context.next_name`) and, inside a graph, left empty for the
    kernel to use the op's node name.
    """
    eager = tf.executing_eagerly()
    check_not_xla(kind, eager)
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError(
                "Invalid value for argument `name`. Expected a non-empty "
                f"string or None. Received: name={name!r}"
            )
        return name
    if eager:
        # Per process set: only its members issue its calls.
        return context.next_name(f"{kind}.set{set_id}" if set_id else kind)
    return ""  # inside a graph: the kernel uses the op's node name


_GRAD_COUNTS = weakref.WeakKeyDictionary()  # graph -> {name: gradients built}


def grad_name(op, suffix):
    """The name of the collective in `op`'s gradient: `"{forward}.{suffix}"`,
    `forward` being `op`'s `tensor_name` or (unnamed, in a graph) its node
    name. Never the gradient's own node name, whose `gradients_<n>/` scope
    counts earlier `tf.gradients` calls and may differ between ranks whose
    forward ops agree. In a graph, the k-th further gradient through the
    same op (k >= 1) appends `.{k}`."""
    base = op.get_attr("tensor_name")
    if isinstance(base, bytes):
        base = base.decode()
    if tf.executing_eagerly():
        return f"{base}.{suffix}" if base else None
    if not base:  # its node name (a tape's stand-in op has none: from its output)
        base = op.name if hasattr(op, "name") else op.outputs[0].name.rsplit(":", 1)[0]
    name = f"{base}.{suffix}"
    counts = _GRAD_COUNTS.setdefault(tf.compat.v1.get_default_graph(), {})
    k = counts.get(name, 0)
    counts[name] = k + 1
    return f"{name}.{k}" if k else name
