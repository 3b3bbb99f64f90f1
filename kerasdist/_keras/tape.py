"""`DistributedGradientTape` and `PartialDistributedGradientTape`.

Horovod's TensorFlow 2 way to average gradients in a custom training loop:
wrap the `tf.GradientTape` (before or after recording), and its
`gradient()` returns gradients allreduced across all ranks. A plain Keras 3
optimizer then applies them.
"""

import tensorflow as tf

from kerasdist._keras import reduce as _reduce
from kerasdist._keras import settings as _settings
from kerasdist.common.context import check_initialized, context
from kerasdist.tensorflow import ops
from kerasdist.tensorflow.compression import Compression


class _DistributedTapeMixin:
    """Overrides `gradient()` to reduce the gradients across ranks."""

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients=output_gradients,
                                 unconnected_gradients=unconnected_gradients)
        settings = self.__dict__["_kerasdist_settings"]
        if settings.size() == 1:
            return grads
        ops.check_not_xla("DistributedGradientTape")
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads)
        reduced = _reduce.reduce_gradients(flat_grads, flat_sources, settings)
        return tf.nest.pack_sequence_as(grads, reduced)

    def register_local_source(self, source):
        """Keeps `source`'s gradient local (not allreduced), as Horovod's
        `PartialDistributedGradientTape.register_local_source`."""
        self.__dict__["_kerasdist_settings"].local_ids.add(id(source))


_CLASSES = {}


def _wrap(gradtape, settings):
    if not isinstance(gradtape, tf.GradientTape):
        raise ValueError(
            "Invalid value for argument `gradtape`. Expected a "
            f"`tf.GradientTape`. Received: gradtape={gradtape!r}")
    base = type(gradtape)
    if issubclass(base, _DistributedTapeMixin):
        base = next(b for b in base.__mro__[1:]
                    if not issubclass(b, _DistributedTapeMixin))
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type(base.__name__, (_DistributedTapeMixin, base),
                   {"__module__": base.__module__, "__qualname__": base.__qualname__})
        _CLASSES[base] = cls
    # A new tape object over the same recording: the wrapped tape's state
    # (its recorded operations, persistence, watched variables) is shared.
    tape = object.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape.__dict__["_kerasdist_settings"] = settings
    return tape


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False,
                            op=ops.Average, gradient_predivide_factor=1.0,
                            num_groups=0, groups=None, process_set=None):
    """Wraps a `tf.GradientTape` so that `gradient()` averages across ranks.

    The returned tape records into the same tape as `gradtape` (wrap it
    before `with` or after it); its `gradient()` computes this rank's
    gradients, then allreduces each one (eagerly or inside a `tf.function`).
    `tf.IndexedSlices` gradients are allgathered, or densified with
    `sparse_as_dense=True`. At size 1 the gradients are returned unchanged.

    Args:
        gradtape: The `tf.GradientTape` to wrap.
        device_dense, device_sparse: Unused (CPU only); accepted for Horovod
            compatibility. Default to `""`.
        compression: `Compression.none`, `fp16` or `bf16`, for the wire only.
            Defaults to `Compression.none`.
        sparse_as_dense: Allreduce `tf.IndexedSlices` gradients densely.
            Defaults to False.
        op: `kerasdist.Average`, `kerasdist.Sum` or `kerasdist.Adasum`
            (adaptive summation: needs a power-of-two number of ranks and
            floating-point gradients; do not scale the learning rate by
            `size()` with it). Defaults to `Average`.
        gradient_predivide_factor: With `op=Average`, divide by this factor
            before the sum and by `size / factor` after. Defaults to 1.0.
        num_groups: Deprecated form of `groups=<int>`. Defaults to 0.
        groups: An int `k` (the gradients split into `k` groups, each one
            grouped, fused allreduce) or a list of lists of variables (each
            list one group; the other gradients one by one). Defaults to
            `None`.
        process_set: The `kerasdist.ProcessSet` whose ranks average their
            gradients (only they may call `gradient()`). Defaults to `None`
            (every rank).

    Returns:
        A `tf.GradientTape` (a subclass of `gradtape`'s class).

    Raises:
        ValueError: For an invalid argument.

    Example:

    >>> with tf.GradientTape() as tape:  # doctest: +SKIP
    ...     loss = loss_fn(y, model(x, training=True))
    >>> tape = kerasdist.DistributedGradientTape(tape)  # doctest: +SKIP
    >>> grads = tape.gradient(loss, model.trainable_variables)  # doctest: +SKIP
    >>> optimizer.apply_gradients(zip(grads, model.trainable_variables))  # doctest: +SKIP
    """
    check_initialized()
    del device_dense, device_sparse
    group_spec = _settings.resolve_groups(num_groups, groups)
    settings = _settings.make_settings(op, gradient_predivide_factor, compression,
                                     sparse_as_dense, groups=group_spec,
                                     process_set=process_set)
    return _wrap(gradtape, settings)


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none,
                                   sparse_as_dense=False, op=ops.Average,
                                   gradient_predivide_factor=1.0,
                                   local_layers=None, scale_local_gradients=True,
                                   num_groups=0, groups=None):
    """A `DistributedGradientTape` that leaves some layers' gradients local.

    The gradients of the trainable variables of `local_layers` are not
    allreduced; with `scale_local_gradients` they are divided by the number
    of ranks, as Horovod does. More sources can be added with
    `tape.register_local_source(variable)`.

    Args:
        gradtape, device_dense, device_sparse, compression, sparse_as_dense,
            op, gradient_predivide_factor, num_groups, groups: As in
            `DistributedGradientTape`.
        local_layers: A Keras layer or a list of layers. Defaults to `None`.
        scale_local_gradients: Divide local gradients by the number of
            ranks. Defaults to True.

    Returns:
        A `tf.GradientTape`.

    Example:

    >>> tape = kerasdist.PartialDistributedGradientTape(  # doctest: +SKIP
    ...     tape, local_layers=[model.get_layer("head")])
    """
    tape = DistributedGradientTape(
        gradtape, compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        num_groups=num_groups, groups=groups)
    settings = tape.__dict__["_kerasdist_settings"]
    settings.local_ids = _settings.variable_ids(local_layers)
    settings.scale_local = bool(scale_local_gradients)
    return tape
