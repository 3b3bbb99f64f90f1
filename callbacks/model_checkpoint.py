"""`ModelCheckpoint` that only rank 0 writes, atomically."""

import os

import keras

from kerasdist.common.context import context
from kerasdist.common.files import atomic_save


def _compiled_metrics(model):
    """The metric objects compiled into `model` (inside Keras' containers)."""
    found = []
    for metric in getattr(model, "metrics", None) or []:
        inner = getattr(metric, "metrics", None)
        if isinstance(inner, (list, tuple)):
            found.extend(inner)
    return found


def monitor_mode(callback_name, monitor, model):
    """Resolves `mode="auto"` the way Keras 3's monitoring callbacks do.

    `loss` (or `val_loss`) is minimized; otherwise the compiled metric whose
    name is `monitor` without its `val_` prefix decides, by the direction
    each Keras metric declares (accuracy, AUC, precision... go up; errors go
    down). The name of the metric plays no part.

    Returns:
        `"min"` or `"max"`.

    Raises:
        ValueError: If no compiled metric of that name declares a direction.
    """
    name = monitor[4:] if monitor.startswith("val_") else monitor
    mode = "min" if name == "loss" else None
    for metric in _compiled_metrics(model):
        # Keras 3 metrics carry their direction as `_direction`, "up" or
        # "down"; it is what keras.callbacks.ModelCheckpoint reads too.
        direction = getattr(metric, "_direction", None)
        if getattr(metric, "name", None) == name and direction is not None:
            mode = "max" if direction == "up" else "min"
    if mode is None:
        raise ValueError(
            f"{callback_name} cannot tell whether `{monitor}` should be "
            "maximized or minimized: no compiled metric of that name declares "
            "a direction. Pass `mode='max'` to keep the highest value or "
            f"`mode='min'` to keep the lowest. Received: monitor={monitor!r}, "
            "mode='auto'"
        )
    return mode


class ModelCheckpoint(keras.callbacks.Callback):
    """Saves the model (or its weights) from rank 0 only, atomically.

    Same arguments as `keras.callbacks.ModelCheckpoint`. Every rank tracks the
    monitored value (use it after `MetricAverageCallback`, so the decision
    uses the averaged metric and is the same everywhere); only rank 0 touches
    the file system. Each save writes a temporary file and renames it, so a
    kill during a save leaves the previous checkpoint loadable.

    Args:
        filepath: Path ending in `.keras` (or `.weights.h5` with
            `save_weights_only=True`); may contain `{epoch}`, `{batch}` and
            log keys such as `{val_loss:.2f}`.
        monitor: The log key to monitor. Defaults to `"val_loss"`.
        verbose: 1 prints a line when rank 0 saves. Defaults to 0.
        save_best_only: Save only when `monitor` improves. Defaults to False.
        save_weights_only: Save weights only. Defaults to False.
        mode: `"auto"`, `"min"` or `"max"`. With `"auto"`, as in Keras 3,
            `loss` is minimized and a compiled metric's own direction decides
            otherwise (whatever its name); resolved at the first
            `save_best_only` decision, which raises a `ValueError` if no
            compiled metric of that name declares a direction. Defaults to
            `"auto"`.
        save_freq: `"epoch"` or an integer number of batches. Defaults to
            `"epoch"`.
        initial_value_threshold: Initial best value for `save_best_only`.
            Defaults to `None` (the first value counts as an improvement).

    Raises:
        ValueError: For a bad suffix, `mode` or `save_freq`.
    """

    # kerasdist's fit guard: its batch hooks never set `stop_training`.
    _kerasdist_never_stops = True

    def __init__(self, filepath, monitor="val_loss", verbose=0,
                 save_best_only=False, save_weights_only=False, mode="auto",
                 save_freq="epoch", initial_value_threshold=None):
        super().__init__()
        filepath = os.fspath(filepath)
        suffix = ".weights.h5" if save_weights_only else ".keras"
        if not filepath.endswith(suffix):
            raise ValueError(
                f"Invalid value for argument `filepath`. Expected a path ending "
                f"in `{suffix}` (save_weights_only={save_weights_only}). "
                f"Received: filepath={filepath}"
            )
        if mode not in ("auto", "min", "max"):
            raise ValueError(
                "Invalid value for argument `mode`. Expected one of 'auto', "
                f"'min', 'max'. Received: mode={mode!r}"
            )
        if save_freq != "epoch" and not (isinstance(save_freq, int) and save_freq > 0):
            raise ValueError(
                "Invalid value for argument `save_freq`. Expected 'epoch' or a "
                f"positive integer. Received: save_freq={save_freq!r}"
            )
        self.filepath = filepath
        self.monitor = monitor
        self.verbose = verbose
        self.save_best_only = save_best_only
        self.save_weights_only = save_weights_only
        self.save_freq = save_freq
        self.mode = mode
        self._direction = None if mode == "auto" else mode
        self.best = initial_value_threshold
        self._batches_seen = 0
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.save_freq != "epoch":
            self._batches_seen += 1
            if self._batches_seen % self.save_freq == 0:
                self._maybe_save(self._epoch, batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._maybe_save(epoch, None, logs)

    def _improved(self, current):
        if self._direction is None:
            self._direction = monitor_mode("ModelCheckpoint", self.monitor, self.model)
        if self.best is None:
            return True
        return current > self.best if self._direction == "max" else current < self.best

    def _maybe_save(self, epoch, batch, logs):
        logs = dict(logs or {})
        if self.save_best_only:
            current = logs.get(self.monitor)
            if current is None:
                if context.rank == 0:
                    print(f"[kerasdist] ModelCheckpoint: `{self.monitor}` is not "
                          f"in the logs (available: {sorted(logs)}); skipping.")
                return
            if not self._improved(float(current)):
                return
            self.best = float(current)
        if context.rank != 0:
            return
        path = self.filepath.format(epoch=epoch + 1, batch=batch, **logs)
        if self.save_weights_only:
            atomic_save(self.model.save_weights, path)
        else:
            atomic_save(self.model.save, path)
        if self.verbose:
            print(f"[kerasdist] Epoch {epoch + 1}: rank 0 saved {path}")
