"""Gradient reduction on the TensorFlow backend, shared by
`DistributedOptimizer` and `DistributedGradientTape` (settings, grouping
and local variables: settings.py)."""

import tensorflow as tf

from kerasdist._keras import settings as _settings
from kerasdist.tensorflow import ops


def reduce_one(grad, settings, name=None):
    """Allreduces one gradient. A `tf.IndexedSlices` one is allgathered,
    which takes no scale factors; the reduction being linear, the combined
    factor scales the gathered values (so a predivided average stays an
    average)."""
    if isinstance(grad, tf.IndexedSlices) and not settings.sparse_as_dense:
        out = ops.allreduce(grad, op=settings.op, name=name,
                            process_set=settings.process_set)
        factor = settings.prescale * settings.postscale
        if factor != 1.0:
            out = tf.IndexedSlices(out.values * tf.cast(factor, out.values.dtype),
                                   out.indices, dense_shape=out.dense_shape)
        return out
    return ops.allreduce(
        grad, op=settings.op, name=name, prescale_factor=settings.prescale,
        postscale_factor=settings.postscale, compression=settings.compression,
        sparse_as_dense=settings.sparse_as_dense, process_set=settings.process_set)


def _scale_local(grad, size):
    size = float(size)
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(size, grad.values.dtype),
                                grad.indices, dense_shape=grad.dense_shape)
    return grad / tf.cast(size, grad.dtype)


def _dense(grad, settings):
    return not isinstance(grad, tf.IndexedSlices) or settings.sparse_as_dense


def reduce_gradients(grads, variables, settings):
    """Reduces a flat list of gradients (None kept) for `variables`."""
    grads = list(grads)
    size = settings.size()
    if size == 1:
        return grads
    out, shared = _settings.split_local(grads, variables, settings, size, _scale_local)
    for group in _settings.group_plan(shared, variables, settings.groups):
        dense = [i for i in group if _dense(grads[i], settings)]
        for i in group:
            if i not in dense:
                out[i] = reduce_one(grads[i], settings)
        if len(dense) == 1 and settings.groups is None:
            out[dense[0]] = reduce_one(grads[dense[0]], settings)
        elif dense:
            values = [tf.convert_to_tensor(grads[i]) for i in dense]
            reduced = ops.grouped_allreduce(
                values, op=settings.op, prescale_factor=settings.prescale,
                postscale_factor=settings.postscale,
                compression=settings.compression, process_set=settings.process_set)
            for i, r in zip(dense, reduced):
                out[i] = r
    return out
