"""`BackupAndRestore`: resume an interrupted distributed run."""

import os

import keras
import numpy as np

from kerasdist.callbacks.model_checkpoint import atomic_save
from kerasdist.functions import broadcast_object, broadcast_variables
from kerasdist.runtime import context


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up training state from rank 0 and restores it on every rank.

    At the end of every epoch (or every `save_freq` batches) rank 0 writes
    the model variables, the optimizer variables and the next epoch to
    `backup_dir/state.npz`, atomically. When `fit` starts again, rank 0 reads
    the backup and broadcasts it, so every rank resumes at the same epoch
    with identical weights and optimizer state. Non-root ranks never touch
    `backup_dir`; it only has to be visible to rank 0.

    Args:
        backup_dir: Directory for the backup.
        save_freq: `"epoch"` or an integer number of batches. Defaults to
            `"epoch"`.
        delete_checkpoint: Delete the backup when training finishes.
            Defaults to True.

    Example:

    >>> model.fit(x, y, epochs=10, callbacks=[
    ...     kerasdist.callbacks.BackupAndRestore("/tmp/backup")])
    """

    def __init__(self, backup_dir, save_freq="epoch", delete_checkpoint=True):
        super().__init__()
        if not backup_dir:
            raise ValueError("Invalid value for argument `backup_dir`. Expected "
                             f"a directory path. Received: backup_dir={backup_dir!r}")
        if save_freq != "epoch" and not (isinstance(save_freq, int) and save_freq > 0):
            raise ValueError("Invalid value for argument `save_freq`. Expected "
                             f"'epoch' or a positive integer. Received: {save_freq!r}")
        self.backup_dir = os.fspath(backup_dir)
        self.path = os.path.join(self.backup_dir, "state.npz")
        self.save_freq = save_freq
        self.delete_checkpoint = delete_checkpoint
        self._epoch = 0
        self._batches = 0

    def _variables(self):
        opt = self.model.optimizer
        if not opt.built:
            opt.build(self.model.trainable_variables)
        return list(self.model.variables) + list(opt.variables)

    def on_train_begin(self, logs=None):
        variables = self._variables()
        epoch = None
        if context.rank == 0 and os.path.exists(self.path):
            with np.load(self.path) as state:
                epoch = int(state["epoch"])
                if len(state.files) - 1 != len(variables):
                    raise ValueError(
                        f"The backup {self.path} holds {len(state.files) - 1} "
                        f"variables but the model and optimizer have "
                        f"{len(variables)}. Delete the backup or restore the "
                        "same model."
                    )
                for i, v in enumerate(variables):
                    v.assign(state[f"v{i}"])
        epoch = broadcast_object(epoch, root_rank=0, name="backup_and_restore.epoch")
        if epoch is not None:
            broadcast_variables(variables, 0, name="backup_and_restore.state")
            # Keras' fit loop starts from this attribute (it is how Keras'
            # own BackupAndRestore resumes).
            self.model._initial_epoch = epoch
            if context.rank == 0:
                print(f"[kerasdist] BackupAndRestore: resuming at epoch {epoch + 1}")

    def _backup(self, next_epoch):
        if context.rank != 0:
            return
        arrays = {f"v{i}": np.asarray(v.numpy()) for i, v in enumerate(self._variables())}
        arrays["epoch"] = np.asarray(next_epoch)

        def write(tmp):
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)

        atomic_save(write, self.path)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.save_freq != "epoch":
            self._batches += 1
            if self._batches % self.save_freq == 0:
                self._backup(self._epoch)

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._backup(epoch + 1)

    def on_train_end(self, logs=None):
        if self.delete_checkpoint and context.rank == 0 and os.path.exists(self.path):
            os.remove(self.path)
