"""A Horovod TensorFlow 2 custom training loop, run on kerasdist.

Written in the style of Horovod's TF2 MNIST example: `DistributedGradientTape`
and a broadcast after the first step. Compared with a Horovod script only
the import changed, plus what Keras 3 and this offline machine force (each
marked `# Keras 3:` or `# offline:`). The lines marked `# test:` check that
the replicas end identical.
"""

import os
import sys

import numpy as np
import tensorflow as tf

import kerasdist as hvd  # was: import horovod.tensorflow as hvd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "examples"))  # offline: local MNIST
from mnist_data import load_mnist  # noqa: E402  offline: local MNIST

STEPS = int(os.environ.get("KD_TF2_MNIST_STEPS", "200"))


def main():
    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    (mnist_images, mnist_labels), _ = load_mnist()  # offline: not load_data(path=...)

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
         tf.cast(mnist_labels, tf.int64))
    )
    dataset = dataset.repeat().shuffle(10000, seed=hvd.rank()).batch(128)

    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, [3, 3], activation="relu"),
        tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    loss = tf.losses.SparseCategoricalCrossentropy()

    # Horovod: adjust learning rate based on number of GPUs.
    opt = tf.optimizers.Adam(0.001 * hvd.size())

    checkpoint_dir = os.environ.get("KD_TEST_TMP", "/tmp") + "/checkpoints"
    checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # Horovod: add Horovod Distributed GradientTape.
        tape = hvd.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

        # Horovod: broadcast initial variable states from rank 0 to all other
        # processes. This is necessary to ensure consistent initialization of
        # all workers when training is started with random weights or
        # restored from a checkpoint.
        #
        # Note: broadcast should be done after the first gradient step to
        # ensure optimizer initialization.
        if first_batch:
            hvd.broadcast_variables(mnist_model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)  # Keras 3: a property

        return loss_value

    # Horovod: adjust number of steps based on number of GPUs.
    for batch, (images, labels) in enumerate(dataset.take(STEPS // hvd.size())):
        loss_value = training_step(images, labels, batch == 0)

        if batch % 10 == 0 and hvd.local_rank() == 0:
            print("Step #%d\tLoss: %.6f" % (batch, loss_value), flush=True)

    # Horovod: save checkpoints only on worker 0 to prevent other workers from
    # corrupting it.
    if hvd.rank() == 0:
        checkpoint.save(checkpoint_dir)

    # test: every rank holds the same weights, bit for bit.
    mine = [w.numpy() for w in mnist_model.trainable_variables]  # test
    everyone = hvd.allgather_object(mine)  # test
    for other in everyone:  # test
        for a, b in zip(other, mine):  # test
            np.testing.assert_array_equal(a, b)  # test
    assert float(loss_value) < 1.0, float(loss_value)  # test: it learned
    print("rank %d: replicas identical, final loss %.4f" % (hvd.rank(), loss_value),
          flush=True)  # test


if __name__ == "__main__":
    main()
