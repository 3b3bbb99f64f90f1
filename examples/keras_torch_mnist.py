"""Trains the classic MNIST CNN with Keras 3 on the PyTorch backend,
data-parallel with kerasdist.

Run it on 2 processes, or as a plain single-process script:

    kerasdist-run -np 2 python examples/keras_torch_mnist.py
    python examples/keras_torch_mnist.py

It is `keras_mnist.py` with `KERAS_BACKEND=torch` and numpy inputs instead
of a `tf.data` pipeline; it needs no TensorFlow. Every line that differs
from single-process Keras carries a `# kerasdist:` comment. The gradients
go through kerasdist's engine (never `torch.distributed`, which stays
uninitialized, so Keras does not wrap the model in DDP). At the end each
rank prints a digest of its weights: they are identical.

The data comes from `examples/data/mnist` (see `mnist_data.py`).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "torch")  # this example is for the torch backend

import argparse  # noqa: E402
import hashlib  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kerasdist as kd  # kerasdist: the distributed-training toolkit  # noqa: E402
import kerasdist.data  # kerasdist: sharding for numpy inputs  # noqa: E402
from mnist_data import PIXEL_MEAN, PIXEL_STD, load_mnist  # noqa: E402

START_TIME = time.time()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2,
                        help="Number of epochs (default: 2).")
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
    return parser.parse_args()


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


def preprocess(images):
    """Standardizes uint8 images and adds the channel axis."""
    return ((images.astype("float32") / 255.0 - PIXEL_MEAN) / PIXEL_STD)[..., None]


def main():
    args = parse_args()
    kd.init()  # kerasdist: must be called first, on every rank
    # kerasdist: a different seed per rank, so that dropout masks differ;
    # the initial weights are broadcast from rank 0 anyway.
    keras.utils.set_random_seed(args.seed + kd.rank())  # kerasdist: per-rank seed
    per_rank = args.global_batch_size // kd.size()  # kerasdist: split the batch
    if kd.rank() == 0:  # kerasdist: print once, not once per rank
        print(f"{kd.size()} rank(s), {per_rank} examples per rank per step, "  # kerasdist
              f"backend {keras.config.backend()}", flush=True)

    (x_train, y_train), (x_test, y_test) = load_mnist(args.data_dir)
    # kerasdist: each rank trains on every N-th example; all get the same count.
    x_train, y_train = kerasdist.data.shard_arrays(x_train, y_train)  # kerasdist
    steps = len(x_train) // per_rank
    if args.steps_per_epoch:
        steps = min(steps, args.steps_per_epoch)
    x_train, y_train = x_train[:steps * per_rank], y_train[:steps * per_rank]

    model = build_model()
    lr = kd.scale_learning_rate(args.lr)  # kerasdist: N times the single-process rate
    optimizer = kd.DistributedOptimizer(keras.optimizers.Adam(lr))  # kerasdist
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    callbacks = [
        # kerasdist: start every rank from rank 0's weights and optimizer state.
        kd.callbacks.BroadcastGlobalVariablesCallback(0),  # kerasdist
        # kerasdist: average the epoch's metrics over the ranks.
        kd.callbacks.MetricAverageCallback(),  # kerasdist
        # kerasdist: ramp the rate from `lr / N` to `lr` over the first epoch.
        kd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=1),  # kerasdist
    ]
    model.fit(preprocess(x_train), y_train.astype("int64"), batch_size=per_rank,
              epochs=args.epochs, shuffle=True, callbacks=callbacks,
              verbose=2 if kd.rank() == 0 else 0)  # kerasdist: log on rank 0 only

    # kerasdist: each rank evaluates its shard of the test set; the counts of
    # correct answers are summed over the ranks.
    x_mine, y_mine = x_test[kd.rank()::kd.size()], y_test[kd.rank()::kd.size()]  # kerasdist
    predicted = np.argmax(model.predict(preprocess(x_mine), verbose=0), axis=1)
    counts = kd.allgather_object((int((predicted == y_mine).sum()), len(y_mine)))  # kerasdist
    accuracy = sum(c for c, _ in counts) / sum(n for _, n in counts)
    weights = b"".join(np.asarray(keras.ops.convert_to_numpy(v)).tobytes()
                       for v in model.weights)
    print(f"rank {kd.rank()} weights digest: {hashlib.sha256(weights).hexdigest()[:16]}",
          flush=True)
    if kd.rank() == 0:  # kerasdist: print once, not once per rank
        print(f"wall time: {time.time() - START_TIME:.1f} s")
        print(f"test accuracy: {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
