"""`DistributedOptimizer` and `load_model` for Keras 3.

Keras 3's gradient path is `fit` -> `train_step` -> `apply_gradients` ->
`apply(grads, variables)`. The distributed optimizer is the user's optimizer
with `apply()` overridden to allreduce the gradients first: one allreduce op
per gradient, so in a compiled step TensorFlow starts each one as soon as its
gradient exists and communication overlaps backprop. On the torch backend
Keras calls `apply` eagerly after `backward()`, and the gradients go out as
one grouped allreduce (kerasdist/_keras/reduce_torch.py). On the JAX backend
Keras calls `stateless_apply` inside its jitted step; it is overridden too,
and the gradients go out as one grouped XLA custom call
(kerasdist/_keras/reduce_jax.py).
"""

import keras

from kerasdist._keras import backend as _backend
from kerasdist._keras import first_update as _first_update
from kerasdist._keras import fit_guard as _fit_guard
from kerasdist._keras import settings as _settings
from kerasdist._keras.compression import Compression
from kerasdist.common.context import check_initialized
from kerasdist.common.reduce_ops import Adasum, Average


class _DistributedMixin:
    """Overrides `apply()` to average gradients across ranks first."""

    _kerasdist_distributed = True

    def apply(self, grads, trainable_variables=None):
        if self.__dict__.get("_kerasdist_reduced"):  # inside our stateless_apply
            return super().apply(grads, trainable_variables)
        return super().apply(self._kerasdist_reduce(grads, trainable_variables),
                             trainable_variables)

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        # Keras' JAX trainer calls this inside its jitted step; a
        # LossScaleOptimizer's does not go through `apply`. Reduce first
        # (before a loss scale's finite check, so every rank skips alike),
        # then let `apply` pass the gradients through.
        reduced = self._kerasdist_reduce(grads, None, stateless=True)
        self.__dict__["_kerasdist_reduced"] = True
        try:
            return super().stateless_apply(optimizer_variables, reduced, trainable_variables)
        finally:
            self.__dict__.pop("_kerasdist_reduced", None)

    def _kerasdist_reduce(self, grads, trainable_variables=None, stateless=False):
        settings = self.__dict__.get("_kerasdist_settings")
        # Checked at every size, so a single-process run already reports it.
        _backend.check_not_xla("DistributedOptimizer")
        if settings is None or settings.size() == 1:
            return grads
        variables = None
        if trainable_variables is not None:
            variables = list(trainable_variables)
            _first_update.sync_once(self, variables, settings.local_ids,
                                    settings.process_set)
        elif stateless:
            # Inside a traced step: no broadcast here (fit's ran before its
            # first step); the optimizer's variables name the gradients.
            variables = list(getattr(self, "_trainable_variables", None) or []) or None
            if variables:
                _first_update.check_traced(self, variables, settings.local_ids,
                                           settings.process_set)
        return _backend.reduce_gradients(grads, variables, settings)

    def register_local_var(self, var):
        """Keeps `var`'s gradient local (not allreduced), as Horovod's
        `PartialDistributedOptimizer.register_local_var`."""
        settings = self.__dict__.get("_kerasdist_settings")
        if settings is not None:
            settings.local_ids.add(id(var))

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


def _reduce_before_loss_scale(model):
    """Keras' `compile` wraps the optimizer of a model with the
    `"mixed_float16"` policy in a `LossScaleOptimizer`. Around a distributed
    optimizer, it would check the gradients for inf/NaN before they are
    reduced, and reduce them in one branch only: a rank with a non-finite
    gradient would skip the allreduce the others wait on. The reduction
    moves to the outer optimizer, before its check, as `DistributedOptimizer`
    arranges itself under a global `"mixed_float16"` policy."""
    outer = getattr(model, "optimizer", None)
    inner = getattr(outer, "inner_optimizer", None)
    if (not isinstance(outer, keras.optimizers.LossScaleOptimizer)
            or not getattr(inner, "_kerasdist_distributed", False)
            or getattr(outer, "_kerasdist_distributed", False)):
        return
    settings = inner.__dict__.pop("_kerasdist_settings")
    inner.__class__ = type(inner).__bases__[1]  # the wrapped Keras class
    _make_distributed(outer, settings)


def _make_distributed(optimizer, settings):
    # `fit` of a model with this optimizer agrees on stops and step counts.
    _fit_guard.install(_reduce_before_loss_scale)
    optimizer.__class__ = _distributed_class(type(optimizer))
    optimizer.__dict__["_kerasdist_settings"] = settings
    _first_update.register(optimizer)
    return optimizer


def DistributedOptimizer(
    optimizer,
    name=None,
    compression=Compression.none,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    device_dense="",
    device_sparse="",
    process_set=None,
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
        op: `kerasdist.Average`, `kerasdist.Sum` or `kerasdist.Adasum`
            (adaptive summation: needs a power-of-two number of ranks and
            floating-point gradients; do not scale the learning rate by
            `size()` with it). Defaults to `Average`.
        backward_passes_per_step: Accumulate gradients locally over this many
            steps before updating, via Keras' `gradient_accumulation_steps`.
            Defaults to 1.
        average_aggregated_gradients: With `backward_passes_per_step > 1`,
            average (True) or sum (False) the accumulated gradients. Defaults
            to False.
        sparse_as_dense: Allreduce `tf.IndexedSlices` gradients densely.
            Defaults to False.
        gradient_predivide_factor: With `op=Average`, divide by this factor
            before the sum and by `size / factor` after (also for
            `tf.IndexedSlices` gradients, whose gathered values are scaled).
            Defaults to 1.0.
        num_groups: Deprecated form of `groups=<int>`. Defaults to 0.
        groups: An int `k`: the gradients are split into `k` groups, each
            allreduced in one grouped (fused) op; or a list of lists of
            variables, each list one group (the other gradients one by one).
            Defaults to `None` (one allreduce per gradient).
        device_dense, device_sparse: Unused (CPU only); accepted for Horovod
            compatibility. Default to `""`.
        process_set: The `kerasdist.ProcessSet` whose ranks average their
            gradients (only they may train with this optimizer). Defaults
            to `None` (every rank).

    If nothing has broadcast the variables yet (no
    `BroadcastGlobalVariablesCallback`, no `broadcast_variables`), the first
    update broadcasts the trainable variables and the optimizer's state from
    rank 0 before applying, so the replicas stay identical.

    Returns:
        The same optimizer, now distributed.

    Raises:
        ValueError: For invalid arguments, or `backward_passes_per_step > 1`
            on an optimizer that is already built.

    Example:

    >>> opt = kerasdist.DistributedOptimizer(keras.optimizers.Adam(1e-3))  # doctest: +SKIP
    >>> model.compile(optimizer=opt, loss="mse")  # doctest: +SKIP
    """
    check_initialized()
    _backend.check_supported("DistributedOptimizer")
    del name, device_dense, device_sparse
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            "Invalid value for argument `optimizer`. Expected a Keras 3 "
            f"optimizer instance. Received: optimizer={optimizer!r}"
        )
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(
            "Invalid value for argument `backward_passes_per_step`. Expected "
            f"an integer >= 1. Received: {backward_passes_per_step!r}"
        )
    if op == Adasum and _backend.name() == "jax":
        raise NotImplementedError(
            "`DistributedOptimizer(op=kerasdist.Adasum)` is not supported on the JAX "
            "backend yet. Use op=kerasdist.Average or kerasdist.Sum.")
    group_spec = _settings.resolve_groups(num_groups, groups)
    _settings.make_settings(op, gradient_predivide_factor, compression,
                          sparse_as_dense, process_set=process_set)  # validates
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
    settings = _settings.make_settings(op, gradient_predivide_factor, compression,
                                     sparse_as_dense, postscale, group_spec, process_set)
    return _make_distributed(optimizer, settings)


def PartialDistributedOptimizer(optimizer, name=None, compression=Compression.none,
                                op=Average, backward_passes_per_step=1,
                                average_aggregated_gradients=False,
                                sparse_as_dense=False,
                                gradient_predivide_factor=1.0, local_layers=None,
                                scale_local_gradients=True, num_groups=0,
                                groups=None):
    """A `DistributedOptimizer` that leaves some layers' gradients local.

    The gradients of the trainable variables of `local_layers` are not
    allreduced: each rank updates those variables from its own data (for
    example a per-rank embedding or head). More variables can be added with
    `optimizer.register_local_var(var)`.

    Args:
        optimizer, name, compression, op, backward_passes_per_step,
            average_aggregated_gradients, sparse_as_dense,
            gradient_predivide_factor, num_groups, groups: As in
            `DistributedOptimizer`.
        local_layers: A Keras layer or a list of layers whose variables stay
            local. Defaults to `None`.
        scale_local_gradients: Divide the local gradients by the number of
            ranks, as Horovod does (so that they are on the scale of the
            averaged ones). Defaults to True.

    Returns:
        The same optimizer, now distributed except for the local variables.

    Example:

    >>> opt = kerasdist.PartialDistributedOptimizer(  # doctest: +SKIP
    ...     keras.optimizers.SGD(0.1), local_layers=[model.get_layer("head")])
    """
    optimizer = DistributedOptimizer(
        optimizer, name=name, compression=compression, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        num_groups=num_groups, groups=groups)
    settings = optimizer.__dict__["_kerasdist_settings"]
    settings.local_ids = _settings.variable_ids(local_layers)
    settings.scale_local = bool(scale_local_gradients)
    return optimizer


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, compile=True, safe_mode=True):
    """Loads a saved model and makes its optimizer distributed again.

    Models saved with a `DistributedOptimizer` record the plain Keras
    optimizer, so `keras.models.load_model` also loads them; this function
    additionally wraps the restored optimizer (keeping its state) so that
    training continues distributed.

    Args:
        filepath: Path of a `.keras` file.
        custom_optimizers: A list of custom optimizer classes the model may
            have been saved with (as in Horovod); they are added to
            `custom_objects` under their class names. Defaults to `None`.
        custom_objects: As in `keras.models.load_model`. Defaults to `None`.
        compression: Compression for the restored optimizer. Defaults to
            `Compression.none`.
        compile: As in `keras.models.load_model`. Defaults to True.
        safe_mode: As in `keras.models.load_model`. Defaults to True.

    Returns:
        The loaded Keras model.

    Example:

    >>> model = kerasdist.load_model("ckpt.keras")  # doctest: +SKIP
    """
    check_initialized()
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        if not isinstance(cls, type):
            raise ValueError(
                "Invalid value for argument `custom_optimizers`. Expected a "
                f"list of optimizer classes. Received: {custom_optimizers!r}")
        objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(
        filepath, custom_objects=objects or None, compile=compile,
        safe_mode=safe_mode)
    opt = getattr(model, "optimizer", None)
    if compile and isinstance(opt, keras.optimizers.Optimizer):
        _make_distributed(opt, _settings.Settings(Average, 1.0, 1.0, compression, False))
    return model


def is_distributed(optimizer):
    """Returns True for an optimizer made by `DistributedOptimizer`."""
    return isinstance(optimizer, _DistributedMixin)


__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "load_model",
           "is_distributed"]
