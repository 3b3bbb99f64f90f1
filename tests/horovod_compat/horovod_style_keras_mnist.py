"""A Horovod-style Keras MNIST script, as Horovod users write them.

Only the import line differs from a Horovod script (`kerasdist.keras` in
place of `horovod.tensorflow.keras`), plus what Keras 3 itself forces on any
script: no `experimental_run_tf_function` in `compile()`, and checkpoint
paths ending in `.keras`. Everything Horovod-specific is used as Horovod
documents it. Work is scaled by COMPAT_EPOCHS / COMPAT_STEPS.
"""

import os

import tensorflow as tf

import kerasdist.keras as hvd

hvd.init()

# Pin one GPU per local rank (a no-op on CPU machines).
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

(images, labels), _ = tf.keras.datasets.mnist.load_data(path="mnist-%d.npz" % hvd.rank())
dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(labels, tf.int64)))
dataset = dataset.repeat().shuffle(10000).batch(128)

model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(32, [3, 3], activation="relu"),
    tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation="softmax"),
])

scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
              metrics=["accuracy"])

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
]
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint("./checkpoint-{epoch}.keras"))

verbose = 1 if hvd.rank() == 0 else 0
epochs = int(os.environ.get("COMPAT_EPOCHS", "24"))
steps = int(os.environ.get("COMPAT_STEPS", "500"))
history = model.fit(dataset, steps_per_epoch=steps // hvd.size(), callbacks=callbacks,
                    epochs=epochs, verbose=verbose)

# The rest of the Horovod surface a Keras script uses.
weights = tf.concat([tf.reshape(w, [-1]) for w in model.weights], 0)
same = hvd.allreduce(weights, op=hvd.Max) - hvd.allreduce(weights, op=hvd.Min)
assert float(tf.reduce_max(same)) == 0.0, "replicas differ"
assert int(hvd.broadcast(tf.constant(hvd.rank()), root_rank=0)) == 0
hvd.broadcast_variables(model.variables, root_rank=0)
assert hvd.allreduce(tf.ones([2]), compression=hvd.Compression.fp16).dtype == tf.float32
try:
    opt.lr
except AttributeError as e:
    assert "learning_rate" in str(e)
if hvd.rank() == 0:
    restored = hvd.load_model("./checkpoint-%d.keras" % epochs)
    print("horovod-style script finished; accuracy %.3f; restored %s" % (
        history.history["accuracy"][-1], type(restored.optimizer).__name__))
