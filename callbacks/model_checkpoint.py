"""`ModelCheckpoint` that only rank 0 writes, atomically."""

import os

import keras
import numpy as np

from kerasdist.runtime import context


def atomic_save(save_fn, filepath):
    """Calls `save_fn(tmp_path)` and renames the result onto `filepath`.

    The temporary file sits in the same directory with the same suffix (Keras
    picks the format from it), so the rename is atomic: a process killed
    during a save leaves the previous file intact.
    """
    directory, base = os.path.split(os.path.abspath(filepath))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{base}")
    try:
        save_fn(tmp)
        os.replace(tmp, filepath)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


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
        mode: `"auto"`, `"min"` or `"max"`. Defaults to `"auto"`.
        save_freq: `"epoch"` or an integer number of batches. Defaults to
            `"epoch"`.
        initial_value_threshold: Initial best value for `save_best_only`.
            Defaults to `None`.

    Raises:
        ValueError: For a bad suffix, `mode` or `save_freq`.
    """

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
        if mode == "auto":
            mode = "max" if ("acc" in monitor or monitor.startswith("fmeasure")) else "min"
        self.filepath = filepath
        self.monitor = monitor
        self.verbose = verbose
        self.save_best_only = save_best_only
        self.save_weights_only = save_weights_only
        self.save_freq = save_freq
        self.mode = mode
        self.best = initial_value_threshold
        if self.best is None:
            self.best = -np.inf if mode == "max" else np.inf
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
        return current > self.best if self.mode == "max" else current < self.best

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
