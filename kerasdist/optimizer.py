"""`DistributedOptimizer` and `load_model` for Keras 3.

Keras 3's gradient path is `fit` -> `train_step` -> `apply_gradients` ->
`apply(grads, variables)`. The distributed optimizer is the user's optimizer
with `apply()` overridden to allreduce the gradients first: one allreduce op
per gradient, so in a compiled step TensorFlow starts each one as soon as its
gradient exists and communication overlaps backprop.
"""

import keras

from kerasdist import _fit_guard, ops
from kerasdist.compression import Compression
from kerasdist.runtime import check_initialized, context


class _Settings:
    """How gradients are reduced; kept off Keras' attribute tracking."""

    __slots__ = ("op", "prescale", "postscale", "compression", "sparse_as_dense")

    def __init__(self, op, prescale, postscale, compression, sparse_as_dense):
        self.op = op
        self.prescale = prescale
        self.postscale = postscale
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense


class _DistributedMixin:
    """Overrides `apply()` to average gradients across ranks first."""

    _kerasdist_distributed = True

    def apply(self, grads, trainable_variables=None):
        return super().apply(self._kerasdist_reduce(grads), trainable_variables)

    def _kerasdist_reduce(self, grads):
        settings = self.__dict__.get("_kerasdist_settings")
        # Checked at every size, so a single-process run already reports it.
        ops._check_not_xla("DistributedOptimizer")
        if settings is None or context.size == 1:
            return grads
        reduced = []
        for g in grads:
            if g is None:
                reduced.append(None)
                continue
            reduced.append(
                ops.allreduce(
                    g,
                    op=settings.op,
                    prescale_factor=settings.prescale,
                    postscale_factor=settings.postscale,
                    compression=settings.compression,
                    sparse_as_dense=settings.sparse_as_dense,
                )
            )
        return reduced

    @property
    def lr(self):
        raise AttributeError(
            "`optimizer.lr` was removed in Keras 3. Use "
            "`optimizer.learning_rate` instead (a variable: read it with "
            "`float(optimizer.learning_rate)`, set it with "
            "`optimizer.learning_rate.assign(value)`)."
        )

    @lr.setter
    def lr(self, value):
        self.lr  # raises the same message


_CLASSES = {}


def _distributed_class(base):
    if issubclass(base, _DistributedMixin):
        return base
    cls = _CLASSES.get(base)
    if cls is None:
        # Same name and module as the wrapped class, so that a saved model
        # records a plain Keras optimizer and loads anywhere without
        # kerasdist; `kerasdist.load_model` makes it distributed again.
        cls = type(
            base.__name__,
            (_DistributedMixin, base),
            {"__module__": base.__module__, "__qualname__": base.__qualname__},
        )
        _CLASSES[base] = cls
    return cls


def _make_distributed(optimizer, settings):
    # `fit` of a model with this optimizer agrees on stops and step counts.
    _fit_guard.install()
    optimizer.__class__ = _distributed_class(type(optimizer))
    optimizer.__dict__["_kerasdist_settings"] = settings
    return optimizer


def DistributedOptimizer(
    optimizer,
    name=None,
    compression=Compression.none,
    op=ops.Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
):
    """Makes a Keras 3 optimizer average gradients across all ranks.

    The optimizer is modified in place and returned: its `apply()` (used by
    `fit`, `apply_gradients` and custom loops) allreduces the gradients
    before the update. Learning rate, schedules, `iterations`, variables and
    `get_config()` are the wrapped optimizer's own.

    Under the `"mixed_float16"` policy the optimizer is wrapped in a
    `keras.optimizers.LossScaleOptimizer` here, and the allreduce happens
    before its finite check, so a non-finite gradient on one rank makes every
    rank skip the step (instead of one rank skipping the allreduce and the
    others waiting for it).

    Args:
        optimizer: A Keras 3 optimizer instance (any subclass, or a
            `LossScaleOptimizer`).
        name: Unused; accepted for Horovod compatibility. Defaults to `None`.
        compression: `Compression.none`, `fp16` or `bf16`, for the wire only.
            Defaults to `Compression.none`.
        op: `kerasdist.Average` or `kerasdist.Sum`. Defaults to `Average`.
        backward_passes_per_step: Accumulate gradients locally over this many
            steps before updating, via Keras' `gradient_accumulation_steps`.
            Defaults to 1.
        average_aggregated_gradients: With `backward_passes_per_step > 1`,
            average (True) or sum (False) the accumulated gradients. Defaults
            to False.
        sparse_as_dense: Allreduce `tf.IndexedSlices` gradients densely.
            Defaults to False.
        gradient_predivide_factor: With `op=Average`, divide by this factor
            before the sum and by `size / factor` after. Defaults to 1.0.

    Returns:
        The same optimizer, now distributed.

    Raises:
        ValueError: For invalid arguments, or `backward_passes_per_step > 1`
            on an optimizer that is already built.

    Example:

    >>> opt = kerasdist.DistributedOptimizer(keras.optimizers.Adam(1e-3))
    >>> model.compile(optimizer=opt, loss="mse")
    """
    check_initialized()
    del name
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            "Invalid value for argument `optimizer`. Expected a Keras 3 "
            f"optimizer instance. Received: optimizer={optimizer!r}"
        )
    if op not in (ops.Average, ops.Sum):
        raise ValueError(
            "Invalid value for argument `op`. Expected kerasdist.Average or "
            f"kerasdist.Sum. Received: op={op!r}"
        )
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(
            "Invalid value for argument `backward_passes_per_step`. Expected "
            f"an integer >= 1. Received: {backward_passes_per_step!r}"
        )
    if gradient_predivide_factor != 1.0 and op != ops.Average:
        raise ValueError(
            "`gradient_predivide_factor` requires op=kerasdist.Average. "
            f"Received: op={op!r}"
        )
    if (
        keras.mixed_precision.global_policy().name == "mixed_float16"
        and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    ):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    inner = optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        inner = optimizer.inner_optimizer
    postscale = 1.0
    if backward_passes_per_step > 1:
        if inner.built:
            raise ValueError(
                "`backward_passes_per_step > 1` must be set before the "
                "optimizer is built (before the first training step)."
            )
        inner.gradient_accumulation_steps = backward_passes_per_step
        if not average_aggregated_gradients:
            # Keras averages accumulated gradients; Horovod's default sums.
            postscale = float(backward_passes_per_step)
    prescale = 1.0
    reduce_op = op
    if gradient_predivide_factor != 1.0:
        reduce_op = ops.Sum
        prescale = 1.0 / gradient_predivide_factor
        postscale *= gradient_predivide_factor / context.size
    settings = _Settings(reduce_op, prescale, postscale, compression, sparse_as_dense)
    return _make_distributed(optimizer, settings)


def load_model(filepath, custom_objects=None, compile=True,
               compression=Compression.none, safe_mode=True):
    """Loads a saved model and makes its optimizer distributed again.

    Models saved with a `DistributedOptimizer` record the plain Keras
    optimizer, so `keras.models.load_model` also loads them; this function
    additionally wraps the restored optimizer (keeping its state) so that
    training continues distributed.

    Args:
        filepath: Path of a `.keras` file.
        custom_objects: As in `keras.models.load_model`. Defaults to `None`.
        compile: As in `keras.models.load_model`. Defaults to True.
        compression: Compression for the restored optimizer. Defaults to
            `Compression.none`.
        safe_mode: As in `keras.models.load_model`. Defaults to True.

    Returns:
        The loaded Keras model.
    """
    check_initialized()
    model = keras.models.load_model(
        filepath, custom_objects=custom_objects, compile=compile, safe_mode=safe_mode
    )
    opt = getattr(model, "optimizer", None)
    if compile and isinstance(opt, keras.optimizers.Optimizer):
        _make_distributed(opt, _Settings(ops.Average, 1.0, 1.0, compression, False))
    return model


def is_distributed(optimizer):
    """Returns True for an optimizer made by `DistributedOptimizer`."""
    return isinstance(optimizer, _DistributedMixin)


__all__ = ["DistributedOptimizer", "load_model", "is_distributed"]
