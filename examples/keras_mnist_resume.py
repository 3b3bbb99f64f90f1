"""Resumes an interrupted distributed MNIST run with `BackupAndRestore`.

`keras_mnist.py` with `kerasdist.callbacks.BackupAndRestore`: at the end of
every epoch rank 0 backs up the model, the optimizer state and the epoch
number to `--backup-dir`. When the script starts again with the same
`--backup-dir`, rank 0 reads the backup and broadcasts it to every rank,
and training continues with the next epoch. Try it:

    kerasdist-run -np 2 python examples/keras_mnist_resume.py --crash-after-epoch 1
    kerasdist-run -np 2 python examples/keras_mnist_resume.py

The first run "crashes" (every rank calls `os._exit(1)`) at the end of
epoch 1, after the backup is written; the second resumes at epoch 2. The
backup is deleted when a run completes, so a third run starts afresh.
Every line that differs from single-process Keras carries a `# kerasdist:`
comment.
"""

import time

START_TIME = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist as kd  # kerasdist: the distributed-training toolkit  # noqa: E402
import kerasdist.data  # kerasdist: sharded input pipelines  # noqa: E402
from mnist_data import PIXEL_MEAN, PIXEL_STD, load_mnist  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3,
                        help="Number of epochs (default: 3).")
    parser.add_argument("--backup-dir",
                        default=os.path.join(tempfile.gettempdir(), "kerasdist_mnist_backup"),
                        help="Where rank 0 keeps the backup (default: "
                             "%(default)s). Use the same one to resume.")
    parser.add_argument("--crash-after-epoch", type=int, default=None,
                        metavar="N",
                        help="Simulate a crash: every rank exits with status 1 "
                             "at the end of epoch N (1-based), after the "
                             "backup of that epoch is written.")
    parser.add_argument("--data-dir", default=None,
                        help="Directory with the MNIST IDX files (default: "
                             "$KERASDIST_DATA_DIR, else examples/data/mnist).")
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="Cap on the training steps per epoch, for quick "
                             "runs (default: a full epoch).")
    parser.add_argument("--global-batch-size", type=int, default=128,
                        help="Examples per step over all ranks (default: 128).")
    parser.add_argument("--lr", type=float, default=1e-3,
                        help="Learning rate of a single process (default: "
                             "1e-3); it is multiplied by the number of ranks.")
    parser.add_argument("--seed", type=int, default=42, help="Random seed.")
    args = parser.parse_args()
    if args.crash_after_epoch is not None and args.crash_after_epoch < 1:
        parser.error("--crash-after-epoch must be a positive epoch number")
    return args


def build_model():
    return keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        keras.layers.Conv2D(32, kernel_size=3, activation="relu"),
        keras.layers.Conv2D(64, kernel_size=3, activation="relu"),
        keras.layers.MaxPooling2D(pool_size=2),
        keras.layers.Dropout(0.25),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10, activation="softmax"),
    ])


def preprocess(images, labels):
    """Standardizes a batch of uint8 images and adds the channel axis."""
    images = tf.cast(images, tf.float32)[..., tf.newaxis] / 255.0
    images = (images - PIXEL_MEAN) / PIXEL_STD
    return images, tf.cast(labels, tf.int32)


class ReportStart(keras.callbacks.Callback):
    """Prints the epoch that training starts (or resumes) at, on rank 0.

    Place it after `BackupAndRestore`: the first epoch `fit()` runs is the
    one after the last backed-up epoch.
    """

    def __init__(self, epochs, backup_dir):
        super().__init__()
        self.epochs = epochs
        self.backup_dir = backup_dir
        self.reported = False

    def on_epoch_begin(self, epoch, logs=None):
        if self.reported:
            return
        self.reported = True
        if kd.rank() == 0:  # kerasdist: print once, not once per rank
            if epoch > 0:
                done = "epoch 1" if epoch == 1 else f"epochs 1-{epoch}"
                print(f"resuming at epoch {epoch + 1}/{self.epochs} ({done} "
                      f"restored from the backup in {self.backup_dir})",
                      flush=True)
            else:
                print(f"starting at epoch 1/{self.epochs} (no backup in "
                      f"{self.backup_dir})", flush=True)


class CrashAfterEpoch(keras.callbacks.Callback):
    """Simulates a crash of every rank at the end of epoch `epoch` (1-based).

    Place it after `BackupAndRestore`, whose `on_epoch_end` writes the
    backup. The barrier makes sure rank 0 has finished writing before any
    rank exits: the launcher kills the remaining ranks as soon as one fails.
    """

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 != self.epoch:
            return
        kd.barrier()  # kerasdist: wait until rank 0 has written the backup
        if kd.rank() == 0:  # kerasdist: print once, not once per rank
            print(f"simulated crash at the end of epoch {epoch + 1} (exit "
                  "status 1); run again without --crash-after-epoch to "
                  "resume", flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def main():
    args = parse_args()
    kd.init()  # kerasdist: must be called first, on every rank
    keras.utils.set_random_seed(args.seed + kd.rank())  # kerasdist: per-rank seed (dropout)

    (x_train, y_train), (x_test, y_test) = load_mnist(args.data_dir)
    train_ds, steps = kerasdist.data.distribute_dataset(  # kerasdist: shard + batch
        tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        global_batch_size=args.global_batch_size,  # kerasdist: split over ranks
        shuffle_buffer=len(x_train) // kd.size(),  # kerasdist: the whole shard
        seed=args.seed)
    train_ds = train_ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    if args.steps_per_epoch:
        steps = min(steps, args.steps_per_epoch)
        train_ds = train_ds.repeat()  # so capped epochs never run out of data
    test_ds = kerasdist.data.shard(  # kerasdist: this rank's shard
        tf.data.Dataset.from_tensor_slices((x_test, y_test)))
    test_ds = test_ds.batch(args.global_batch_size).map(preprocess)

    model = build_model()
    lr = kd.scale_learning_rate(args.lr)  # kerasdist: N times the single-process rate
    optimizer = kd.DistributedOptimizer(keras.optimizers.Adam(lr))  # kerasdist: averages gradients
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        jit_compile=False,  # kerasdist: collectives cannot run inside XLA
    )

    callbacks = [
        kd.callbacks.BroadcastGlobalVariablesCallback(0),  # kerasdist: same start everywhere
        kd.callbacks.MetricAverageCallback(),  # kerasdist: average the logs over ranks
        kd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=1),  # kerasdist: lr / N -> lr
        # kerasdist: rank 0 writes the backup; on restart it is broadcast, so
        # every rank resumes with the same weights, optimizer and epoch.
        kd.callbacks.BackupAndRestore(args.backup_dir),  # kerasdist: instead of keras.callbacks'
        ReportStart(args.epochs, args.backup_dir),
    ]
    if args.crash_after_epoch is not None:
        callbacks.append(CrashAfterEpoch(args.crash_after_epoch))
    model.fit(
        train_ds,
        epochs=args.epochs,
        steps_per_epoch=steps,
        callbacks=callbacks,
        verbose=2 if kd.rank() == 0 else 0,  # kerasdist: one line per epoch, rank 0 only
    )

    results = model.evaluate(test_ds, verbose=0, return_dict=True)
    count = len(range(kd.rank(), len(x_test), kd.size()))  # kerasdist: this shard's size
    # kerasdist: add up the correct predictions and the examples of all
    # shards: the accuracy on the whole test set, for any number of ranks.
    correct, count = kd.allreduce(  # kerasdist
        tf.constant([round(results["accuracy"] * count), count], tf.int64),  # kerasdist
        op=kd.Sum, name="test_counts").numpy()  # kerasdist
    if kd.rank() == 0:  # kerasdist: print once, not once per rank
        print(f"wall time: {time.time() - START_TIME:.1f} s")
        print(f"test accuracy: {correct / count:.4f}", flush=True)


if __name__ == "__main__":
    main()
