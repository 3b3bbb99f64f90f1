"""A callback that ramps the learning rate up over the first epochs."""

import numbers

from kerasdist.common import basics

from .lr_schedule import LearningRateScheduleCallback


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from the single-worker rate to `initial_lr`.

    Training with `N` ranks usually uses `N` times the single-worker
    learning rate (`initial_lr`, see `kerasdist.scale_learning_rate`).
    Starting at that rate can diverge, so before every batch of the first
    `warmup_epochs` epochs this callback sets

    `lr = initial_lr / N * (epoch_float * (N - 1) / warmup_epochs + 1)`

    with `epoch_float = epoch + batch / steps_per_epoch`: the rate grows
    linearly from `initial_lr / N` to `initial_lr`. When the warmup ends it
    sets exactly `initial_lr` and stops touching the learning rate, so
    `LearningRateScheduleCallback`s with `start_epoch=warmup_epochs` can
    take over. With one rank the rate stays `initial_lr`.

    The optimizer's learning rate must be a plain value (a Keras variable).
    If it is a `keras.optimizers.schedules.LearningRateSchedule`, use the
    schedule `kerasdist.LinearWarmup` instead of this callback.

    Args:
        initial_lr: The learning rate at the end of the warmup, already
            scaled by the number of ranks. No default; it is required.
        warmup_epochs: The length of the warmup in epochs (may be
            fractional). Defaults to 5.
        momentum_correction: Accepted for compatibility with Horovod. It
            has no effect with Keras 3 optimizers, whose `momentum` is a
            Python constant of the compiled train step, so it cannot follow
            the learning rate. Defaults to `True`.
        steps_per_epoch: The number of batches per epoch. Defaults to
            `None`, which uses the number of steps `model.fit()` reports.
        verbose: If positive, rank 0 prints the learning rate when the
            warmup ends (and, once, that momentum correction is not
            applied, if the optimizer uses momentum). Defaults to 0.

    Raises:
        ValueError: If an argument has an invalid value; when training
            starts, if the optimizer's learning rate cannot be set or the
            number of steps per epoch is unknown.

    Example:

    >>> kerasdist.init()  # doctest: +SKIP
    >>> lr = kerasdist.scale_learning_rate(0.01)  # doctest: +SKIP
    >>> model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")  # doctest: +SKIP
    >>> warmup = kerasdist.callbacks.LearningRateWarmupCallback(  # doctest: +SKIP
    ...     initial_lr=lr, warmup_epochs=3, verbose=1)
    >>> model.fit(dataset, epochs=10, callbacks=[warmup])  # doctest: +SKIP
    """

    # kerasdist's fit guard: its batch hooks never set `stop_training`.
    _kerasdist_never_stops = True

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        if (isinstance(warmup_epochs, bool)
                or not isinstance(warmup_epochs, numbers.Real)
                or not warmup_epochs > 0):
            raise ValueError(
                "Invalid value for argument `warmup_epochs`. Expected a "
                f"positive number. Received: warmup_epochs={warmup_epochs!r}"
            )
        super().__init__(
            initial_lr,
            multiplier=self._warmup_multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose
        self._size = 1
        self._warming = False
        self._momentum_note_done = False

    def _warmup_multiplier(self, epoch):
        return (epoch * (self._size - 1) / self.warmup_epochs + 1) / self._size

    def _finish_warmup(self, epoch):
        self._set_lr(self.initial_lr)
        self._warming = False
        if self.verbose and basics.rank() == 0:
            lr = float(self._lr_variable())
            print(f"\nEpoch {epoch + 1}: finished learning rate warmup to "
                  f"{lr:g}.", flush=True)

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._size = basics.size()
        self._warming = False
        if (self.verbose and self.momentum_correction and self._has_momentum()
                and not self._momentum_note_done and basics.rank() == 0):
            self._momentum_note_done = True
            print("LearningRateWarmupCallback: `momentum_correction` has no "
                  "effect with Keras 3 optimizers (their momentum is a "
                  "constant of the compiled train step); the momentum is "
                  "left unchanged.", flush=True)

    def _has_momentum(self):
        """True if the optimizer uses momentum (e.g. SGD with momentum > 0),
        the only case where a momentum correction would matter."""
        opt = self.model.optimizer
        opt = getattr(opt, "inner_optimizer", opt)  # LossScaleOptimizer
        try:
            return float(getattr(opt, "momentum", 0.0) or 0.0) > 0.0
        except (TypeError, ValueError):
            return True

    def on_train_batch_begin(self, batch, logs=None):
        epoch = self._epoch + batch / self._steps
        if epoch < self.warmup_epochs:
            self._set_lr(self.initial_lr * self._warmup_multiplier(epoch))
            self._warming = True
        elif self._warming:
            # The warmup ended inside this epoch (fractional warmup_epochs).
            self._finish_warmup(self._epoch)

    def on_epoch_end(self, epoch, logs=None):
        if self._warming and epoch + 1 >= self.warmup_epochs:
            self._finish_warmup(epoch)
        super().on_epoch_end(epoch, logs)
