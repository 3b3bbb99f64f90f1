"""A callback that averages the epoch's metrics over all ranks."""

import keras
import numpy as np

from kerasdist._keras import backend as _backend
from kerasdist.common import objects
from kerasdist.common.reduce_ops import Average, Sum


def _numeric(value):
    """Returns `value` as a float64 array, or None if it is not numeric."""
    if isinstance(value, (str, bytes)) or value is None:
        return None
    try:
        array = np.asarray(value)
    except Exception:  # pylint: disable=broad-except
        return None
    if array.dtype.kind not in "biuf":
        return None
    return array.astype(np.float64)


class MetricAverageCallback(keras.callbacks.Callback):
    """Averages the metrics in `logs` over all ranks at the end of each epoch.

    Each rank computes its metrics on its own shard of the data. At the end
    of every epoch this callback replaces every numeric entry of `logs`
    (training metrics and `val_` metrics) by its average over the ranks, in
    place, so that the callbacks after it (`EarlyStopping`,
    `ModelCheckpoint`, `ReduceLROnPlateau`, `History`, ...) see the same
    global values on every rank. Put it before those callbacks. Entries that
    are not numbers or numeric arrays are left alone.

    Before averaging, the ranks check that they log the same keys; if not,
    every rank raises a `ValueError` naming the keys that differ (instead of
    waiting forever for a collective).

    With `weighted=True` each rank's value is weighted by the number of
    batches it ran this epoch: training batches for training metrics and
    validation batches for `val_` metrics. When all batches are full this
    is a weighting by the number of samples, which gives the exact global
    mean of per-sample averages when ranks have shards of different sizes.
    With `weighted=False` (Horovod's behaviour) it is the plain mean over
    ranks.

    Args:
        weighted: Whether to weight each rank's values by its number of
            batches in the epoch. Defaults to `False`.

    Raises:
        ValueError: If `weighted` is not a bool; at the end of an epoch, if
            the ranks' `logs` have different keys, or a key is numeric on
            some ranks only.

    Example:

    >>> callbacks = [  # doctest: +SKIP
    ...     kerasdist.callbacks.MetricAverageCallback(),
    ...     keras.callbacks.EarlyStopping(monitor="val_loss", patience=3),
    ... ]
    >>> model.fit(x, y, validation_data=(vx, vy), callbacks=callbacks)  # doctest: +SKIP
    """

    # kerasdist's fit guard: its batch hooks never set `stop_training`.
    _kerasdist_never_stops = True

    def __init__(self, weighted=False):
        super().__init__()
        if not isinstance(weighted, bool):
            raise ValueError(
                "Invalid value for argument `weighted`. Expected a bool. "
                f"Received: weighted={weighted!r}"
            )
        self.weighted = weighted
        self._train_batches = 0
        self._val_batches = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._train_batches = 0
        self._val_batches = 0

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the index of the last step run (with
        # `steps_per_execution > 1` one call covers several steps).
        self._train_batches = max(self._train_batches + 1, batch + 1)

    def on_test_begin(self, logs=None):
        self._val_batches = 0

    def on_test_batch_end(self, batch, logs=None):
        self._val_batches = max(self._val_batches + 1, batch + 1)

    def _check_keys(self, epoch, kinds):
        all_kinds = objects.allgather_object(
            sorted(kinds.items()), name="metric_average.keys")
        all_kinds = [dict(k) for k in all_kinds]
        if all(k == all_kinds[0] for k in all_kinds):
            return
        keys = set().union(*all_kinds)
        missing = sorted(k for k in keys if any(k not in r for r in all_kinds))
        mixed = sorted(k for k in keys if k not in missing
                       and len({r[k] for r in all_kinds}) > 1)
        details = "; ".join(
            f"rank {i}: {sorted(r)}" for i, r in enumerate(all_kinds))
        problems = []
        if missing:
            problems.append(f"keys missing on some ranks: {missing}")
        if mixed:
            problems.append(f"keys numeric on some ranks only: {mixed}")
        raise ValueError(
            "MetricAverageCallback: the ranks logged different metrics at "
            f"the end of epoch {epoch + 1} ({'; '.join(problems)}). Every "
            "rank must compile the same metrics and run the same callbacks "
            f"and validation. Keys per rank: {details}"
        )

    def _average_in_place(self, epoch, logs):
        values = {key: _numeric(value) for key, value in logs.items()}
        kinds = {key: "number" if value is not None else "other"
                 for key, value in values.items()}
        self._check_keys(epoch, kinds)
        if self.weighted:
            counts = _backend.allreduce_scalar(
                np.array([self._train_batches, self._val_batches], np.float64),
                Sum, "metric_average.weights")
        for key in sorted(logs):
            value = values[key]
            if value is None:
                continue
            name = f"metric_average.{key}"
            if self.weighted:
                is_val = key.startswith("val_")
                weight = float(self._val_batches if is_val else self._train_batches)
                total = counts[1] if is_val else counts[0]
                if total > 0:
                    summed = _backend.allreduce_scalar(value * weight, Sum, name)
                    result = summed / total
                else:  # No rank ran a batch of this kind: plain mean.
                    result = _backend.allreduce_scalar(value, Average, name)
            else:
                result = _backend.allreduce_scalar(value, Average, name)
            logs[key] = float(result) if result.ndim == 0 else result

    def on_epoch_end(self, epoch, logs=None):
        # Runs even for empty logs so that every rank joins the key check.
        self._average_in_place(epoch, logs if logs is not None else {})
