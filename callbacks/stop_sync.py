"""A callback that makes every rank stop training at the same point."""

import keras
import numpy as np

from kerasdist._keras import backend as _backend
from kerasdist._keras import fit_guard as _fit_guard
from kerasdist.common.reduce_ops import Max


class SyncStopTrainingCallback(keras.callbacks.Callback):
    """Stops training on every rank as soon as one rank asks to stop.

    Callbacks such as `EarlyStopping`, `TerminateOnNaN` or a user's own set
    `model.stop_training = True`, and they may do so on one rank only (for
    example a NaN loss on one shard, or a callback that runs on rank 0
    only). A rank that stops alone leaves the others waiting in the next
    gradient allreduce.

    **A model compiled with `kerasdist.DistributedOptimizer` does not need
    this callback**: its `fit` already agrees on `stop_training` after the
    last callback, at every batch end (when some rank has a callback that may
    stop there) and every epoch end. Inside such a `fit` this callback does
    nothing. It remains for models whose gradients are reduced another way.

    After every training batch and at the end of every epoch it takes the
    maximum of the ranks' `stop_training` flags with an allreduce and sets
    `model.stop_training` to it, so all ranks stop after the same batch or
    epoch. It must come **last** in the callbacks list, after every callback
    that may set `stop_training`: Keras calls callbacks in list order, and a
    flag set after this callback has run would be seen by one rank only.
    Every rank must run the same number of batches per epoch. The per-batch
    check costs one small allreduce per step (always under the same two
    collective names).

    Example:

    >>> callbacks = [  # doctest: +SKIP
    ...     kerasdist.callbacks.MetricAverageCallback(),
    ...     keras.callbacks.EarlyStopping(monitor="val_loss", patience=3),
    ...     keras.callbacks.TerminateOnNaN(),
    ...     kerasdist.callbacks.SyncStopTrainingCallback(),  # last
    ... ]
    >>> model.fit(x, y, validation_data=(vx, vy), callbacks=callbacks)  # doctest: +SKIP
    """

    # It only propagates a value the ranks agreed on.
    _kerasdist_never_stops = True

    def _sync(self, name):
        if id(self.model) in _fit_guard.ACTIVE:
            return  # the distributed optimizer's fit agrees already
        flag = np.int32(1 if self.model.stop_training else 0)
        stop = int(_backend.allreduce_scalar(flag, Max, name))
        self.model.stop_training = bool(stop)

    def on_train_batch_end(self, batch, logs=None):
        self._sync("sync_stop_training.batch")

    def on_epoch_end(self, epoch, logs=None):
        self._sync("sync_stop_training.epoch")
