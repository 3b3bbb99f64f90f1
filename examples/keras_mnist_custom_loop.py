"""Trains the MNIST CNN with a custom training loop, data-parallel with kerasdist.

The same model and data as `keras_mnist.py`, but instead of `model.fit()`
a `tf.function` step computes the gradients with `tf.GradientTape` and
applies them with `optimizer.apply_gradients()`. Run it with

    kerasdist-run -np 2 python examples/keras_mnist_custom_loop.py
    python examples/keras_mnist_custom_loop.py

Every line that differs from a single-process custom loop carries a
`# kerasdist:` comment. In a custom loop there are no callbacks, so the
script does their work itself: it broadcasts the initial state from rank 0,
warms the learning rate up with the `kerasdist.LinearWarmup` schedule, and
averages the metrics with `kerasdist.allreduce`.
"""

import time

START_TIME = time.time()

import argparse  # noqa: E402

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist as kd  # kerasdist: the distributed-training toolkit  # noqa: E402
import kerasdist.data  # kerasdist: sharded input pipelines  # noqa: E402
from mnist_data import PIXEL_MEAN, PIXEL_STD, load_mnist  # noqa: E402


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
    parser.add_argument("--warmup-epochs", type=float, default=1.0,
                        help="Epochs of learning-rate warmup (default: 1).")
    parser.add_argument("--log-every", type=int, default=100,
                        help="Print the loss every this many steps.")
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


def preprocess(images, labels):
    """Standardizes a batch of uint8 images and adds the channel axis."""
    images = tf.cast(images, tf.float32)[..., tf.newaxis] / 255.0
    images = (images - PIXEL_MEAN) / PIXEL_STD
    return images, tf.cast(labels, tf.int32)


def main():
    args = parse_args()
    kd.init()  # kerasdist: must be called first, on every rank
    keras.utils.set_random_seed(args.seed + kd.rank())  # kerasdist: per-rank seed (dropout)
    is_root = kd.rank() == 0  # kerasdist: rank 0 prints
    if is_root:  # kerasdist: print once, not once per rank
        print(f"{kd.size()} rank(s), global batch {args.global_batch_size} "  # kerasdist
              f"= {args.global_batch_size // kd.size()} per rank", flush=True)  # kerasdist

    (x_train, y_train), (x_test, y_test) = load_mnist(args.data_dir)
    train_ds, steps = kerasdist.data.distribute_dataset(  # kerasdist: shard + batch
        tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        global_batch_size=args.global_batch_size,  # kerasdist: split over ranks
        shuffle_buffer=len(x_train) // kd.size(),  # kerasdist: the whole shard
        seed=args.seed)
    train_ds = train_ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    if args.steps_per_epoch:
        steps = min(steps, args.steps_per_epoch)
    # kerasdist: each rank tests on its own shard; evaluation issues no
    # collective, so the shards may differ by one example.
    test_ds = kerasdist.data.shard(  # kerasdist: this rank's shard
        tf.data.Dataset.from_tensor_slices((x_test, y_test)))
    test_ds = test_ds.batch(args.global_batch_size).map(preprocess)

    model = build_model()
    lr = kd.scale_learning_rate(args.lr)  # kerasdist: N times the single-process rate
    # kerasdist: a schedule that ramps the rate from `lr / N` to `lr` over
    # the first `warmup_epochs` (counted in optimizer steps).
    schedule = kd.LinearWarmup(lr, warmup_steps=int(steps * args.warmup_epochs))  # kerasdist
    optimizer = keras.optimizers.Adam(learning_rate=schedule)  # kerasdist: `schedule`, not `lr`
    optimizer = kd.DistributedOptimizer(optimizer)  # kerasdist: averages gradients
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    train_loss = keras.metrics.Mean(name="loss")
    train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")

    # kerasdist: build the optimizer now (rather than in the first step), so
    # that rank 0's initial weights *and* optimizer state can be broadcast
    # before any update. `model.weights` leaves out the dropout seed states:
    # each rank keeps its own masks.
    optimizer.build(model.trainable_variables)  # kerasdist
    kd.broadcast_variables(model.weights + optimizer.variables, root_rank=0)  # kerasdist

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            probs = model(images, training=True)
            loss = loss_fn(labels, probs)
        grads = tape.gradient(loss, model.trainable_variables)
        # The DistributedOptimizer allreduces (averages) the gradients here,
        # so every rank applies the same update.
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        train_loss.update_state(loss)
        train_accuracy.update_state(labels, probs)
        return loss

    @tf.function
    def count_correct(images, labels):
        predictions = tf.argmax(model(images, training=False), axis=-1,
                                output_type=tf.int32)
        return tf.reduce_sum(tf.cast(predictions == labels, tf.int64))

    for epoch in range(args.epochs):
        epoch_start = time.time()
        train_loss.reset_state()
        train_accuracy.reset_state()
        for step, (images, labels) in enumerate(train_ds.take(steps)):
            loss = train_step(images, labels)
            if is_root and args.log_every and step % args.log_every == 0:  # kerasdist: rank 0
                print(f"epoch {epoch + 1} step {step}/{steps}: loss {float(loss):.4f} "
                      f"(rank 0's batch)", flush=True)
        # kerasdist: each rank's metrics cover its own shard; average them.
        loss_avg = kd.allreduce(train_loss.result(), op=kd.Average,  # kerasdist
                                name="train_loss")  # kerasdist
        accuracy_avg = kd.allreduce(train_accuracy.result(), op=kd.Average,  # kerasdist
                                    name="train_accuracy")  # kerasdist
        if is_root:  # kerasdist: print once, not once per rank
            print(f"epoch {epoch + 1}/{args.epochs}: loss {float(loss_avg):.4f} "
                  f"accuracy {float(accuracy_avg):.4f} lr "
                  f"{float(optimizer.learning_rate):.2g} "
                  f"({time.time() - epoch_start:.1f} s)", flush=True)

    correct = sum(int(count_correct(images, labels)) for images, labels in test_ds)
    count = len(range(kd.rank(), len(x_test), kd.size()))  # kerasdist: this shard's size
    # kerasdist: add up the correct predictions and the examples of all
    # shards: the accuracy on the whole test set, for any number of ranks.
    correct, count = kd.allreduce(tf.constant([correct, count], tf.int64),  # kerasdist
                                  op=kd.Sum, name="test_counts").numpy()  # kerasdist
    accuracy = correct / count
    if is_root:  # kerasdist: print once, not once per rank
        print(f"wall time: {time.time() - START_TIME:.1f} s")
        print(f"test accuracy: {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
