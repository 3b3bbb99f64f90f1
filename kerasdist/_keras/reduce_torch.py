"""Gradient reduction on the torch backend of Keras 3.

Keras' torch trainer computes the gradients with `backward()` and calls
`optimizer.apply(grads, variables)` eagerly; the distributed optimizer
reduces them there, through the PyTorch binding (kerasdist/torch), with
the settings of settings.py. By default all dense gradients of a step go
out as one grouped allreduce (one batch for the engine to fuse); `groups`
splits them as on TensorFlow.
"""

from kerasdist._keras import settings as _settings
from kerasdist.torch import compression as _compression
from kerasdist.torch import handles as _handles
from kerasdist.torch import mpi_ops


def _reduce_group(grads, indices, variables, settings, compressor):
    tensors, contexts = [], []
    for i in indices:
        t, ctx = compressor.compress(grads[i])
        tensors.append(t)
        contexts.append(ctx)
    handle = mpi_ops.grouped_allreduce_async(
        tensors, name=_settings.gradient_name(variables, indices), op=settings.op,
        prescale_factor=settings.prescale, postscale_factor=settings.postscale,
        process_set=settings.process_set or mpi_ops.global_process_set)
    return handle, contexts


def reduce_gradients(grads, variables, settings):
    """Reduces a flat list of torch gradients (None kept) for `variables`."""
    out, plan = _settings.grouped_plan(grads, variables, settings)
    if not plan:
        return out
    compressor = _settings.binding_compressor(settings.compression,
                                              _compression.Compression)
    # Every group is in flight before the first wait, so the engine can
    # fuse and overlap them.
    pending = [(indices,) + _reduce_group(grads, indices, variables, settings, compressor)
               for indices in plan]
    for indices, handle, contexts in pending:
        reduced = _handles.synchronize(handle)
        for i, r, ctx in zip(indices, reduced, contexts):
            out[i] = compressor.decompress(r, ctx)
    return out
