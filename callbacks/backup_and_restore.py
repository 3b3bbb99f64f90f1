"""`BackupAndRestore`: resume an interrupted distributed run."""

import os

import keras
import numpy as np

from kerasdist.common.context import context
from kerasdist.common.files import atomic_save
from kerasdist._keras import backend as _backend
from kerasdist.common.objects import broadcast_object


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up training state from rank 0 and restores it on every rank.

    At the end of every epoch (or every `save_freq` batches) rank 0 writes
    the model variables, the optimizer variables and the next epoch to
    `backup_dir/state.npz`, atomically. When `fit` starts again, rank 0 reads
    the backup and broadcasts it, so every rank resumes at the same epoch
    with identical weights and optimizer state. Non-root ranks never touch
    `backup_dir`; it only has to be visible to rank 0.

    Rank 0 tells the other ranks whether each read or write worked before
    anything else happens, so a failure (an unreadable or corrupt backup, one
    from a different model, a full disk) is the same clear error on every
    rank instead of an error on rank 0 and a hang elsewhere.

    Args:
        backup_dir: Directory for the backup.
        save_freq: `"epoch"` or an integer number of batches. Defaults to
            `"epoch"`.
        delete_checkpoint: Delete the backup when training finishes.
            Defaults to True.

    Raises:
        ValueError: At `on_train_begin`, on every rank, if the backup cannot
            be read or does not match the model and optimizer.
        OSError: On every rank, if rank 0 cannot write the backup.

    Example:

    >>> model.fit(x, y, epochs=10, callbacks=[  # doctest: +SKIP
    ...     kerasdist.callbacks.BackupAndRestore("/tmp/backup")])
    """

    # kerasdist's fit guard: its batch hooks never set `stop_training`.
    _kerasdist_never_stops = True

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

    def _read(self, variables):
        """Rank 0: the backup's epoch and arrays, checked against `variables`.

        Returns `None` when there is no backup.
        """
        if not os.path.lexists(self.path):
            return None
        with np.load(self.path, allow_pickle=False) as state:
            files = set(state.files)
            expected = {"epoch"} | {f"v{i}" for i in range(len(variables))}
            if files != expected:
                raise ValueError(
                    f"it holds {len(files - {'epoch'})} variables (and "
                    f"{'an' if 'epoch' in files else 'no'} epoch), but the "
                    f"model and optimizer have {len(variables)}"
                )
            epoch = int(state["epoch"])
            arrays = [state[f"v{i}"] for i in range(len(variables))]
        for i, (v, a) in enumerate(zip(variables, arrays)):
            if tuple(a.shape) != tuple(v.shape):
                raise ValueError(
                    f"variable {i} ({v.path}) has shape {tuple(v.shape)} but "
                    f"the backup holds shape {tuple(a.shape)}"
                )
        return epoch, arrays

    def on_train_begin(self, logs=None):
        variables = self._variables()
        restored = status = None
        if context.rank == 0:
            try:
                restored = self._read(variables)
                status = ("ok", None if restored is None else restored[0])
            except Exception as e:  # any failure must reach every rank
                status = ("error", f"{type(e).__name__}: {e}")
        # Agree on the outcome first, so that an error is raised on every
        # rank (and no rank waits in a broadcast that rank 0 never reaches).
        status = broadcast_object(status, root_rank=0, name="backup_and_restore.status")
        if status[0] == "error":
            raise ValueError(
                f"BackupAndRestore could not restore from {self.path} (read "
                f"on rank 0): {status[1].rstrip('.')}. The backup is unreadable, "
                "corrupt, or from a different model. Delete it to start from "
                "scratch, or resume with the same model, optimizer and "
                "`backup_dir`."
            )
        epoch = status[1]
        if epoch is not None:
            if context.rank == 0:
                for v, a in zip(variables, restored[1]):
                    v.assign(a)
            _backend.broadcast_variables(variables, 0, name="backup_and_restore.state")
            # Keras' fit loop starts from this attribute (it is how Keras'
            # own BackupAndRestore resumes).
            self.model._initial_epoch = epoch
            if context.rank == 0:
                print(f"[kerasdist] BackupAndRestore: resuming at epoch {epoch + 1}")

    def _backup(self, next_epoch):
        error = None
        if context.rank == 0:
            try:
                arrays = {f"v{i}": np.asarray(v.numpy())
                          for i, v in enumerate(self._variables())}
                arrays["epoch"] = np.asarray(next_epoch)

                def write(tmp):
                    with open(tmp, "wb") as f:
                        np.savez(f, **arrays)

                atomic_save(write, self.path)
            except Exception as e:  # any failure must reach every rank
                error = f"{type(e).__name__}: {e}"
        if context.size > 1:
            error = broadcast_object(error, root_rank=0, name="backup_and_restore.saved")
        if error is not None:
            raise OSError(
                f"BackupAndRestore could not write the backup {self.path} "
                f"(on rank 0): {error.rstrip('.')}. Check that `backup_dir` is "
                "writable and has free space."
            )

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
