"""The elastic state's Keras callbacks (exported by `kerasdist.elastic`).

Put them in this order, after the callbacks that change the model:
`UpdateEpochStateCallback`, `UpdateBatchStateCallback`,
`CommitStateCallback`; Keras calls a hook in list order, so each commit
records the epoch and batch just finished.
"""

import keras


class CommitStateCallback(keras.callbacks.Callback):
    """Commits the state every `batches_per_commit` batches and at epoch end.

    Args:
        state: A `kerasdist.elastic.State`.
        batches_per_commit: Batches between commits. Defaults to 1.

    Example:

    >>> kerasdist.elastic.CommitStateCallback(state, batches_per_commit=10)  # doctest: +SKIP
    """

    _kerasdist_never_stops = True

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        if not isinstance(batches_per_commit, int) or batches_per_commit < 1:
            raise ValueError(
                "Invalid value for argument `batches_per_commit`. Expected an "
                f"integer >= 1. Received: batches_per_commit={batches_per_commit!r}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self._remaining = batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self._remaining -= 1
        if self._remaining == 0:
            self.state.commit()
            self._remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()
        self._remaining = self.batches_per_commit


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps `state.batch` = the batches of the current epoch done so far.

    A `fit` that resumes mid-epoch (its data skipping the `state.batch`
    batches already done) counts on from there; at epoch end it is 0.

    Args:
        state: A `kerasdist.elastic.State` with a `batch` attribute.
    """

    _kerasdist_never_stops = True

    def __init__(self, state):
        super().__init__()
        self.state = state
        self._offset = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._offset = int(getattr(self.state, "batch", 0) or 0)

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = self._offset + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0
        self._offset = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps `state.epoch` = the number of epochs finished.

    Works with `fit(initial_epoch=state.epoch, ...)` and with Horovod's
    `fit(epochs=EPOCHS - state.epoch)` (epochs counted from 0 again).

    Args:
        state: A `kerasdist.elastic.State` with an `epoch` attribute.
    """

    _kerasdist_never_stops = True

    def __init__(self, state):
        super().__init__()
        self.state = state
        self._base = None

    def on_train_begin(self, logs=None):
        self._base = None

    def on_epoch_begin(self, epoch, logs=None):
        if self._base is None:
            self._base = int(getattr(self.state, "epoch", 0) or 0) - epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = (self._base or 0) + epoch + 1
