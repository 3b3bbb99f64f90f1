"""Learning-rate helpers for data-parallel training.

With `N` ranks each step averages the gradients of `N` batches, so the
usual recipe is to multiply the single-worker learning rate by `N`
(`scale_learning_rate`) and to ramp up to that rate over the first steps
(`LinearWarmup`), which avoids the instability of a large rate at the start.
"""

import numbers

import keras
from keras import ops

from kerasdist.common import basics


def _check_positive_number(value, arg):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(
            f"Invalid value for argument `{arg}`. Expected a positive number. "
            f"Received: {arg}={value!r}"
        )


def scale_learning_rate(lr):
    """Scales a single-worker learning rate by the number of ranks.

    Args:
        lr: The learning rate that suits one worker, as a positive number.
            No default; it is required.

    Returns:
        `lr * kerasdist.size()`, as a Python float.

    Raises:
        ValueError: If `lr` is not a positive number.
        RuntimeError: If kerasdist is not initialized.

    Example:

    >>> kerasdist.init()
    >>> optimizer = keras.optimizers.SGD(kerasdist.scale_learning_rate(0.01))
    """
    _check_positive_number(lr, "lr")
    return float(lr) * basics.size()


@keras.saving.register_keras_serializable(package="kerasdist")
class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """Ramps the learning rate linearly from `target_lr / world_size`.

    For `step < warmup_steps` the rate is
    `target_lr / world_size * (step * (world_size - 1) / warmup_steps + 1)`,
    which starts at the single-worker rate and reaches `target_lr` at
    `warmup_steps`. From then on it is `after(step - warmup_steps)` if
    `after` is given, else `target_lr`. This is the schedule form of
    `kerasdist.callbacks.LearningRateWarmupCallback`, for optimizers whose
    learning rate is a schedule (the callback cannot change those). Steps
    count optimizer updates (batches), not epochs.

    Args:
        target_lr: The learning rate at the end of the warmup, usually
            already scaled by the number of ranks (see
            `scale_learning_rate`). No default; it is required.
        warmup_steps: The number of optimizer steps of the warmup, a
            non-negative integer; 0 disables the warmup. No default; it is
            required.
        world_size: The number of ranks the rate is scaled for. It is stored
            in the config so that a reloaded model keeps the same schedule.
            Defaults to `None`, which uses `kerasdist.size()` at
            construction.
        after: A `keras.optimizers.schedules.LearningRateSchedule` that takes
            over after the warmup, called with the number of steps since the
            warmup ended. Defaults to `None` (constant `target_lr`).

    Raises:
        ValueError: If an argument has an invalid value.
        RuntimeError: If `world_size` is `None` and kerasdist is not
            initialized.

    Example:

    >>> kerasdist.init()
    >>> lr = kerasdist.scale_learning_rate(0.001)
    >>> decay = keras.optimizers.schedules.CosineDecay(lr, decay_steps=10000)
    >>> schedule = kerasdist.LinearWarmup(lr, warmup_steps=500, after=decay)
    >>> optimizer = keras.optimizers.Adam(schedule)
    """

    def __init__(self, target_lr, warmup_steps, world_size=None, after=None):
        super().__init__()
        _check_positive_number(target_lr, "target_lr")
        if (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, numbers.Integral)
                or warmup_steps < 0):
            raise ValueError(
                "Invalid value for argument `warmup_steps`. Expected a "
                f"non-negative integer. Received: warmup_steps={warmup_steps!r}"
            )
        if world_size is None:
            world_size = basics.size()
        if (isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral)
                or world_size < 1):
            raise ValueError(
                "Invalid value for argument `world_size`. Expected a positive "
                f"integer or None. Received: world_size={world_size!r}"
            )
        if after is not None and not isinstance(
                after, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                "Invalid value for argument `after`. Expected a "
                "`keras.optimizers.schedules.LearningRateSchedule` or None. "
                f"Received: after={after!r}"
            )
        self.target_lr = float(target_lr)
        self.warmup_steps = int(warmup_steps)
        self.world_size = int(world_size)
        self.after = after

    def __call__(self, step):
        target = ops.convert_to_tensor(self.target_lr)
        dtype = target.dtype
        step = ops.cast(step, dtype)
        warmup_steps = ops.cast(self.warmup_steps, dtype)
        steps_after = ops.maximum(step - warmup_steps, ops.cast(0, dtype))
        if self.after is None:
            rest = target
        else:
            rest = ops.cast(self.after(steps_after), dtype)
        if self.warmup_steps == 0:
            return rest
        start = target / ops.cast(self.world_size, dtype)
        slope = ops.cast(self.world_size - 1, dtype) / warmup_steps
        warmup = start * (step * slope + ops.cast(1, dtype))
        return ops.where(step < warmup_steps, warmup, rest)

    def get_config(self):
        return {
            "target_lr": self.target_lr,
            "warmup_steps": self.warmup_steps,
            "world_size": self.world_size,
            "after": (None if self.after is None
                      else keras.optimizers.schedules.serialize(self.after)),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        after = config.get("after")
        if isinstance(after, dict):
            config["after"] = keras.optimizers.schedules.deserialize(after)
        return cls(**config)
