"""BackupAndRestore failures are the same clear error on every rank.

argv: directory (shared by the ranks; only rank 0 writes the bad backups).
"""

import os
import sys

import keras
import numpy as np

import kerasdist as kd
from _util import log, main

DIRECTORY = sys.argv[1]


def model(width=8):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(width),
                          keras.layers.Dense(1)])
    m.compile(kd.DistributedOptimizer(keras.optimizers.Adam(1e-2)), "mse")
    return m


def fit(m, backup_dir):
    x = np.random.RandomState(kd.rank()).rand(16, 4).astype("float32")
    m.fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=2, verbose=0,
          callbacks=[kd.callbacks.BroadcastGlobalVariablesCallback(0),
                     kd.callbacks.BackupAndRestore(backup_dir)])


def expect_error(case, backup_dir, kind, text, m=None):
    try:
        fit(m or model(), backup_dir)
    except kind as e:
        message = " ".join(str(e).split())
    else:
        raise AssertionError(f"{case}: no error")
    assert text in message, (case, message)
    everyone = kd.allgather_object(message, name="test.backup.message")
    assert everyone == [message] * kd.size(), (case, everyone)
    log(f"{case}: the same error on every rank: {message}")


def bad_backup(case, write):
    path = os.path.join(DIRECTORY, case)
    if kd.rank() == 0:
        os.makedirs(path)
        write(os.path.join(path, "state.npz"))
    kd.barrier()
    return path


def run():
    # Not a zip file at all.
    path = bad_backup("garbage", lambda p: open(p, "wb").write(b"not a backup" * 10))
    expect_error("garbage", path, ValueError, "could not restore")

    # A well-formed backup cut in half (a crash of a non-atomic writer).
    arrays = {f"v{i}": np.asarray(v.numpy()) for i, v in enumerate(model().variables)}

    def half_npz(p):
        with open(p, "wb") as f:
            np.savez(f, epoch=np.asarray(1), **arrays)
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) // 2)
    path = bad_backup("truncated", half_npz)
    expect_error("truncated", path, ValueError, "could not restore")

    # Unreadable: a directory where the file should be.
    path = bad_backup("unreadable", os.makedirs)
    expect_error("unreadable", path, ValueError, "IsADirectoryError")

    # A backup of another model (different shapes).
    other = model(width=3)
    other.optimizer.build(other.trainable_variables)
    variables = list(other.variables) + list(other.optimizer.variables)

    def other_model(p):
        with open(p, "wb") as f:
            np.savez(f, epoch=np.asarray(1),
                     **{f"v{i}": v.numpy() for i, v in enumerate(variables)})
    path = bad_backup("other-model", other_model)
    expect_error("other-model", path, ValueError, "has shape")

    # Writing fails on rank 0 (backup_dir lies under a regular file).
    blocker = os.path.join(DIRECTORY, "blocker")
    if kd.rank() == 0:
        open(blocker, "w").close()
    kd.barrier()
    expect_error("write", os.path.join(blocker, "backup"), OSError, "could not write")
    log("backup errors ok")


main(run)
