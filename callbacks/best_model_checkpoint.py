"""`BestModelCheckpoint`: Horovod's keep-the-best checkpoint, rank 0 only."""

from kerasdist.callbacks.model_checkpoint import ModelCheckpoint


class BestModelCheckpoint(ModelCheckpoint):
    """Saves the model whenever the monitored value improves (rank 0 only).

    Horovod's `BestModelCheckpoint`: a `ModelCheckpoint` with
    `save_best_only=True` that saves the whole model. Horovod's estimators
    set its path; here it is the `filepath` argument. Writes are atomic, and
    only rank 0 writes (see `kerasdist.callbacks.ModelCheckpoint`).

    Args:
        monitor: The log key to monitor. Defaults to `"val_loss"`.
        verbose: 1 prints a line when rank 0 saves. Defaults to 0.
        mode: `"auto"`, `"min"` or `"max"`. Defaults to `"auto"`.
        save_freq: `"epoch"` or a number of batches. Defaults to `"epoch"`.
        filepath: Path ending in `.keras`. Required (keyword, since Horovod's
            signature has no path). Defaults to `None`.

    Raises:
        ValueError: If `filepath` is missing or does not end in `.keras`.

    Example:

    >>> model.fit(x, y, validation_data=(xv, yv), callbacks=[  # doctest: +SKIP
    ...     kerasdist.callbacks.MetricAverageCallback(),
    ...     kerasdist.callbacks.BestModelCheckpoint(filepath="best.keras")])
    """

    def __init__(self, monitor="val_loss", verbose=0, mode="auto",
                 save_freq="epoch", filepath=None):
        if filepath is None:
            raise ValueError(
                "Invalid value for argument `filepath`. Expected a path "
                "ending in `.keras` (kerasdist has no estimator that sets "
                "it). Received: filepath=None")
        super().__init__(filepath, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=False,
                         mode=mode, save_freq=save_freq)
