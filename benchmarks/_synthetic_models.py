"""The models, optimizers and synthetic batches of `keras_synthetic.py`
(see its docstring for what each model is and why)."""

CLASSES = 10


def build_model(keras, name, spec, quick):
    layers = keras.layers
    if name == "mnist":
        return keras.Sequential([
            keras.Input((28, 28, 1)),
            layers.Conv2D(32, kernel_size=3, activation="relu"),
            layers.Conv2D(64, kernel_size=3, activation="relu"),
            layers.MaxPooling2D(pool_size=2),
            layers.Dropout(0.25),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(CLASSES, activation="softmax"),
        ]), (28, 28, 1)
    if name == "resnet50":
        size = spec["quick_image" if quick else "image"]
        shape = (size, size, 3)
        return keras.applications.ResNet50(weights=None, input_shape=shape,
                                           classes=CLASSES), shape
    if name.startswith("embedding"):
        vocab = spec["quick_vocab" if quick else "vocab"]
        return keras.Sequential([
            keras.Input((spec["seq"],), dtype="int32"),
            layers.Embedding(vocab, 64),
            layers.GlobalAveragePooling1D(),
            layers.Dense(64, activation="relu"),
            layers.Dense(CLASSES, activation="softmax"),
        ]), (spec["seq"],)
    raise ValueError(f"unknown model {name!r}")


def make_optimizer(keras, name, lr_scale):
    if name == "resnet50":  # Horovod's synthetic benchmark: SGD
        return keras.optimizers.SGD(0.01 * lr_scale, momentum=0.9)
    return keras.optimizers.Adam(0.001 * lr_scale)


def synthetic_batch(np, name, spec, shape, batch, seed, quick):
    rng = np.random.default_rng(seed)
    if name.startswith("embedding"):
        vocab = spec["quick_vocab" if quick else "vocab"]
        x = rng.integers(0, vocab, size=(batch,) + shape, dtype=np.int32)
    else:
        x = rng.standard_normal((batch,) + shape, dtype=np.float32)
    y = rng.integers(0, CLASSES, size=(batch,), dtype=np.int32)
    return x, y
