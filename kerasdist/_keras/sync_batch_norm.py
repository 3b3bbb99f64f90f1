"""`SyncBatchNormalization`: batch statistics over the global batch."""

import keras
from keras import ops as kops

from kerasdist.common.context import check_initialized, context
from kerasdist._keras import backend as _backend
from kerasdist.common.reduce_ops import Sum


@keras.saving.register_keras_serializable(package="kerasdist")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization whose training statistics span every rank's batch.

    In training, each rank sums its batch's values, squared values and
    counts per channel; one allreduce (`Sum`) of the three gives the mean
    and (biased) variance of the global batch, which normalize this rank's
    batch and update the moving statistics, so every rank keeps the same
    moving mean and variance, equal to those of one process that sees the
    global batch. Gradients flow through the allreduce. In inference (and
    when the layer is frozen) it is plain `keras.layers.BatchNormalization`.

    Args:
        axis, momentum, epsilon, center, scale, beta_initializer,
            gamma_initializer, moving_mean_initializer,
            moving_variance_initializer, beta_regularizer, gamma_regularizer,
            beta_constraint, gamma_constraint: As in
            `keras.layers.BatchNormalization`.
        fused: Accepted for Horovod compatibility, where it is the
            layer's first argument: only `False` (Horovod's default, the
            unfused computation this layer always does) is valid. Keras 3's
            `BatchNormalization` has no `fused` argument, so it is not passed
            on. Defaults to `False`.
        **kwargs: Other `keras.layers.BatchNormalization` arguments;
            `renorm=True` and `synchronized=True` are not supported.

    Raises:
        ValueError: For `renorm=True`, `synchronized=True`, or `fused`
            that is `None` or true (Horovod refuses `True` and `None`).

    Example:

    >>> model = keras.Sequential([
    ...     keras.layers.Conv2D(32, 3),
    ...     kerasdist.SyncBatchNormalization(),
    ...     keras.layers.ReLU()])
    """

    def __init__(self, axis=-1, momentum=0.99, epsilon=1e-3, center=True,
                 scale=True, fused=False, **kwargs):
        if fused is None or fused:
            raise ValueError(
                "Invalid value for argument `fused`. SyncBatchNormalization "
                "supports only fused=False (its statistics are computed "
                f"unfused, across ranks). Received: fused={fused!r}")
        for flag in ("renorm", "synchronized"):
            if kwargs.get(flag):
                raise ValueError(
                    f"Invalid value for argument `{flag}`. "
                    "SyncBatchNormalization supports only "
                    f"{flag}=False. Received: {flag}={kwargs[flag]!r}")
        kwargs.pop("synchronized", None)
        super().__init__(axis=axis, momentum=momentum, epsilon=epsilon,
                         center=center, scale=scale, **kwargs)

    def _global_moments(self, inputs, mask):
        rank = len(inputs.shape)
        axis = self.axis % rank
        axes = [i for i in range(rank) if i != axis]
        if mask is None:
            weights = kops.ones_like(inputs)
        else:
            weights = kops.cast(kops.expand_dims(mask, axis=-1), inputs.dtype)
            weights = kops.broadcast_to(weights, kops.shape(inputs))
        local = kops.stack([
            kops.sum(inputs * weights, axis=axes),
            kops.sum(kops.square(inputs) * weights, axis=axes),
            kops.sum(weights, axis=axes),
        ])
        if context.initialized and context.size > 1:
            total = _backend.allreduce_differentiable(local, Sum)
        else:
            total = local
        count = kops.maximum(total[2], 1.0)
        mean = total[0] / count
        variance = kops.maximum(total[1] / count - kops.square(mean), 0.0)
        return mean, variance

    def call(self, inputs, training=None, mask=None):
        if mask is not None and len(mask.shape) != len(inputs.shape) - 1:
            raise ValueError(
                "The mask provided should be one dimension less than the "
                f"inputs. Received: mask.shape={mask.shape}, "
                f"inputs.shape={inputs.shape}")
        if not (training and self.trainable):
            return super().call(inputs, training=training, mask=mask)
        check_initialized()
        compute_dtype = keras.backend.result_type(inputs.dtype, "float32")
        inputs = kops.cast(inputs, compute_dtype)
        mean, variance = self._global_moments(inputs, mask)
        moving_mean = kops.cast(self.moving_mean, inputs.dtype)
        moving_variance = kops.cast(self.moving_variance, inputs.dtype)
        self.moving_mean.assign(
            moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(
            moving_variance * self.momentum + variance * (1.0 - self.momentum))
        outputs = kops.batch_normalization(
            x=inputs, mean=mean, variance=variance, axis=self.axis,
            offset=kops.cast(self.beta, inputs.dtype) if self.center else None,
            scale=kops.cast(self.gamma, inputs.dtype) if self.scale else None,
            epsilon=self.epsilon)
        return kops.cast(outputs, self.compute_dtype)
