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

_COMPRESSORS = {"NoneCompressor": _compression.Compression.none,
                "FP16Compressor": _compression.Compression.fp16,
                "BF16Compressor": _compression.Compression.bf16}


def _compressor(compression):
    """The PyTorch binding's compressor for Horovod's standard ones (those
    of `kerasdist.Compression` or of the TensorFlow binding); any other is
    used as given."""
    if getattr(compression, "__module__", "").startswith("kerasdist."):
        return _COMPRESSORS.get(compression.__name__, compression)
    return compression


def _name(variables, indices):
    if variables is None:
        return None  # numbered per call
    path = getattr(variables[indices[0]], "path", None)
    return f"keras.grads.{path}.{len(indices)}" if path else None


def _reduce_group(grads, indices, variables, settings, compressor):
    tensors, contexts = [], []
    for i in indices:
        t, ctx = compressor.compress(grads[i])
        tensors.append(t)
        contexts.append(ctx)
    handle = mpi_ops.grouped_allreduce_async(
        tensors, name=_name(variables, indices), op=settings.op,
        prescale_factor=settings.prescale, postscale_factor=settings.postscale,
        process_set=settings.process_set or mpi_ops.global_process_set)
    return handle, contexts


def reduce_gradients(grads, variables, settings):
    """Reduces a flat list of torch gradients (None kept) for `variables`."""
    grads = list(grads)
    size = settings.size()
    if size == 1:
        return grads
    out, shared = _settings.split_local(grads, variables, settings, size,
                                        lambda g, n: g / n)
    if not shared:
        return out
    groups = settings.groups
    if groups is None:
        plan = [shared]
    else:
        plan = _settings.group_plan(shared, variables, groups)
    compressor = _compressor(settings.compression)
    # Every group is in flight before the first wait, so the engine can
    # fuse and overlap them.
    pending = [(indices,) + _reduce_group(grads, indices, variables, settings, compressor)
               for indices in plan]
    for indices, handle, contexts in pending:
        reduced = _handles.synchronize(handle)
        for i, r, ctx in zip(indices, reduced, contexts):
            out[i] = compressor.decompress(r, ctx)
    return out
