"""A callback that sets the learning rate from a per-epoch multiplier."""

import numbers

import keras


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_steps_per_epoch(steps_per_epoch):
    if steps_per_epoch is not None and (
            isinstance(steps_per_epoch, bool)
            or not isinstance(steps_per_epoch, numbers.Integral)
            or steps_per_epoch < 1):
        raise ValueError(
            "Invalid value for argument `steps_per_epoch`. Expected a positive "
            f"integer or None. Received: steps_per_epoch={steps_per_epoch!r}"
        )


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to `initial_lr * multiplier(epoch)`.

    Within the epochs `[start_epoch, end_epoch)` the optimizer's learning
    rate becomes `initial_lr * multiplier(epoch)`: once at the start of each
    epoch if `staircase=True`, otherwise before every batch with a
    fractional epoch `epoch + batch / steps_per_epoch`. Outside that range
    the learning rate is left alone, so several of these callbacks can
    cover consecutive ranges (and follow a `LearningRateWarmupCallback`).
    At the end of each epoch the current rate is written to
    `logs["learning_rate"]`.

    The optimizer's learning rate must be a plain value (a Keras variable);
    for a `keras.optimizers.schedules.LearningRateSchedule` use a schedule
    such as `kerasdist.LinearWarmup` instead of this callback.

    Args:
        initial_lr: The base learning rate, usually already scaled by the
            number of ranks (`kerasdist.scale_learning_rate`). No default;
            it is required.
        multiplier: A number, or a function of the (possibly fractional)
            epoch returning a number. A number implies `staircase=True`. No
            default; it is required.
        start_epoch: The first epoch (0-based) the callback acts on.
            Defaults to 0.
        end_epoch: The epoch at which it stops acting (exclusive). Defaults
            to `None` (no end).
        staircase: Whether to change the rate once per epoch (`True`) or
            before every batch (`False`). Defaults to `True`.
        momentum_correction: Accepted for compatibility with Horovod. It
            has no effect with Keras 3 optimizers, whose `momentum` is a
            Python constant of the compiled train step. Defaults to `True`.
        steps_per_epoch: The number of batches per epoch, used when
            `staircase=False`. Defaults to `None`, which uses the number of
            steps `model.fit()` reports.

    Raises:
        ValueError: If an argument has an invalid value; when training
            starts, if the optimizer's learning rate cannot be set or the
            number of steps per epoch is unknown.

    Example:

    >>> lr = kerasdist.scale_learning_rate(0.0125)  # doctest: +SKIP
    >>> callbacks = [  # doctest: +SKIP
    ...     kerasdist.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=5),
    ...     kerasdist.callbacks.LearningRateScheduleCallback(
    ...         lr, multiplier=1.0, start_epoch=5, end_epoch=30),
    ...     kerasdist.callbacks.LearningRateScheduleCallback(
    ...         lr, multiplier=0.1, start_epoch=30),
    ... ]
    >>> model.fit(dataset, epochs=40, callbacks=callbacks)  # doctest: +SKIP
    """

    # kerasdist's fit guard: its batch hooks never set `stop_training`.
    _kerasdist_never_stops = True

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                 staircase=True, momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if not _is_number(initial_lr) or initial_lr < 0:
            raise ValueError(
                "Invalid value for argument `initial_lr`. Expected a "
                f"non-negative number. Received: initial_lr={initial_lr!r}"
            )
        if not callable(multiplier) and not _is_number(multiplier):
            raise ValueError(
                "Invalid value for argument `multiplier`. Expected a number "
                "or a function of the epoch. Received: "
                f"multiplier={multiplier!r}"
            )
        if not _is_number(start_epoch) or start_epoch < 0:
            raise ValueError(
                "Invalid value for argument `start_epoch`. Expected a "
                f"non-negative number. Received: start_epoch={start_epoch!r}"
            )
        if end_epoch is not None and (not _is_number(end_epoch)
                                      or end_epoch <= start_epoch):
            raise ValueError(
                "Invalid value for argument `end_epoch`. Expected None or a "
                f"number greater than start_epoch={start_epoch!r}. Received: "
                f"end_epoch={end_epoch!r}"
            )
        _check_steps_per_epoch(steps_per_epoch)
        self.initial_lr = float(initial_lr)
        if callable(multiplier):
            self.multiplier = multiplier
            self.staircase = bool(staircase)
        else:
            constant = float(multiplier)
            self.multiplier = lambda epoch: constant
            self.staircase = True
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self._steps = steps_per_epoch
        self._epoch = 0

    # Helpers shared with LearningRateWarmupCallback.

    def _lr_variable(self):
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            raise ValueError(
                f"{type(self).__name__} needs a compiled model with an "
                "optimizer. Call `model.compile(optimizer=...)` first."
            )
        lr = optimizer.learning_rate
        if not hasattr(lr, "assign"):
            raise ValueError(
                f"{type(self).__name__} cannot change the learning rate of "
                "this optimizer: it was created with a `LearningRateSchedule` "
                "(or a callable), which Keras evaluates from the step count. "
                "Pass a number as the optimizer's learning rate, or express "
                "the schedule as a `LearningRateSchedule` instead of a "
                "callback; for a warmup use `kerasdist.LinearWarmup`, e.g. "
                "`keras.optimizers.SGD(kerasdist.LinearWarmup(lr, "
                "warmup_steps=...))`."
            )
        return lr

    def _resolve_steps_per_epoch(self):
        steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if not steps:
            raise ValueError(
                f"{type(self).__name__} could not determine the number of "
                "steps per epoch: `model.fit()` did not report it (for "
                "example, the dataset's length is unknown). Pass "
                f"`steps_per_epoch=` to {type(self).__name__}() or to "
                "`model.fit()`."
            )
        return steps

    def _set_lr(self, value):
        self._lr_variable().assign(float(value))

    def _in_range(self, epoch):
        return epoch >= self.start_epoch and (
            self.end_epoch is None or epoch < self.end_epoch)

    # Callback hooks.

    def on_train_begin(self, logs=None):
        self._lr_variable()
        if not self.staircase:
            self._steps = self._resolve_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase:
            if batch == 0 and self._in_range(self._epoch):
                self._set_lr(self.initial_lr * self.multiplier(self._epoch))
            return
        epoch = self._epoch + batch / self._steps
        if self._in_range(epoch):
            self._set_lr(self.initial_lr * self.multiplier(epoch))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(self._lr_variable())
