"""What the Keras layer does differently on each Keras backend.

The layer's logic (optimizer, first update, fit guard, callbacks) is the
same everywhere; the few operations below dispatch on
`keras.config.backend()`. On TensorFlow they are the TensorFlow binding's
ops, which also work inside a `tf.function`; elsewhere values are read as
numpy and moved through the engine library's C API (kerasdist/common),
and gradients go through the backend's binding. No framework is imported
that the backend does not use.
"""

import contextlib

import keras
import numpy as np

from kerasdist.common import arrays as _arrays
from kerasdist.common import objects as _objects
from kerasdist.common.broadcast_record import mark_broadcast
from kerasdist.common.reduce_ops import Sum

SUPPORTED = ("tensorflow", "torch", "jax")


def name():
    """The Keras backend in use."""
    return keras.config.backend()


def is_tensorflow():
    return name() == "tensorflow"


def check_supported(what):
    """Raises a clear error on a backend the Keras layer does not serve."""
    if name() not in SUPPORTED:
        raise NotImplementedError(
            f"`{what}` does not support the Keras backend {name()!r} yet. "
            f"Supported backends: {', '.join(SUPPORTED)} (set KERAS_BACKEND).")


def check_not_xla(what):
    """On TensorFlow, refuses a step compiled with XLA (a clear error)."""
    if is_tensorflow():
        from kerasdist.tensorflow import ops

        ops.check_not_xla(what)


def reduce_gradients(grads, variables, settings):
    """Reduces a flat list of gradients (None kept) for `variables`."""
    if is_tensorflow():
        from kerasdist._keras import reduce

        return reduce.reduce_gradients(grads, variables, settings)
    check_supported("DistributedOptimizer")
    if name() == "jax":
        from kerasdist._keras import reduce_jax

        return reduce_jax.reduce_gradients(grads, variables, settings)
    from kerasdist._keras import reduce_torch

    return reduce_torch.reduce_gradients(grads, variables, settings)


def allreduce_scalar(value, op, name, process_set=None):
    """Reduces a Python number (or small array) now; returns numpy."""
    if is_tensorflow():
        import tensorflow as tf

        from kerasdist.tensorflow import ops

        return ops.allreduce(tf.constant(value), op=op, name=name,
                             process_set=process_set).numpy()
    return _arrays.allreduce(np.asarray(value), op=op, name=name, process_set=process_set)


def allreduce_differentiable(tensor, op=Sum):
    """Reduces a backend tensor inside a layer's call; its gradient is
    reduced too (SyncBatchNormalization)."""
    if is_tensorflow():
        from kerasdist.tensorflow import ops

        return ops.allreduce(tensor, op=op)
    check_supported("SyncBatchNormalization")
    if name() == "jax":
        from kerasdist.jax import collectives as jax_collectives

        return jax_collectives.allreduce(tensor, op=op)
    from kerasdist.torch import collectives

    return collectives.allreduce(tensor, op=op)


def broadcast_variables(variables, root_rank, name=None, process_set=None):
    """Assigns `root_rank`'s values to Keras variables on every rank."""
    variables = list(variables)
    if is_tensorflow():
        from kerasdist.tensorflow.functions import broadcast_variables as tf_broadcast

        return tf_broadcast(variables, root_rank, name=name, process_set=process_set)
    values = _arrays.broadcast([keras.ops.convert_to_numpy(v) for v in variables],
                               root_rank, name=name, process_set=process_set)
    for v, value in zip(variables, values):
        v.assign(value)
    mark_broadcast(variables)
    return None


def join():
    """Horovod's `join()` for the Keras layer; returns the last rank to join."""
    if is_tensorflow():
        from kerasdist.tensorflow.ops import join as tf_join

        return int(tf_join())
    return _objects.join()


def eager_scope():
    """A context in which values can be read now: on TensorFlow, lifted out
    of a `tf.function` being traced (`tf.init_scope`); elsewhere a no-op."""
    if is_tensorflow():
        import tensorflow as tf

        return tf.init_scope()
    return contextlib.nullcontext()


def readable(v):
    """Whether Keras variable `v` holds its value now (eagerly)."""
    if is_tensorflow():
        import tensorflow as tf

        try:
            return tuple(tf.convert_to_tensor(v).shape) == tuple(v.shape)
        except Exception:  # not initialized yet
            return False
    return True


def to_numpy(v):
    """A Keras variable's (or tensor's) value as a numpy array."""
    return keras.ops.convert_to_numpy(v)
