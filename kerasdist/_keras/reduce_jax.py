"""Gradient reduction on the JAX backend of Keras 3.

Keras' JAX trainer computes the gradients inside its jitted train step and
calls `optimizer.stateless_apply(...)` there; the distributed optimizer
reduces them first, through the JAX binding (kerasdist/jax), with the
settings of settings.py. By default all dense gradients of a step go out
as one grouped allreduce: one XLA custom call per step, so the step never
depends on the order in which XLA schedules its thunks. `groups` splits
them as on TensorFlow, into custom calls chained by data so that every rank
issues them in the same order.
"""

import jax

from kerasdist._keras import settings as _settings
from kerasdist.common.process_sets import global_process_set
from kerasdist.jax import collectives as _collectives
from kerasdist.jax import compression as _compression


def reduce_gradients(grads, variables, settings):
    """Reduces a flat list of JAX gradients (None kept) for `variables`."""
    out, plan = _settings.grouped_plan(grads, variables, settings)
    if not plan:
        return out
    compressor = _settings.binding_compressor(settings.compression,
                                              _compression.Compression)
    previous = None  # each group waits on the previous one: one order on every rank
    for indices in plan:
        tensors, contexts = [], []
        for i in indices:
            t, ctx = compressor.compress(out[i])
            tensors.append(t)
            contexts.append(ctx)
        if previous is not None:
            tensors, _ = jax.lax.optimization_barrier((tensors, previous))
        reduced = _collectives.grouped_allreduce(
            tensors, op=settings.op, name=_settings.gradient_name(variables, indices),
            process_set=settings.process_set or global_process_set,
            prescale_factor=settings.prescale, postscale_factor=settings.postscale)
        previous = reduced
        for i, r, ctx in zip(indices, reduced, contexts):
            out[i] = compressor.decompress(r, ctx)
    return out
