"""Test-only offline shim: serves `keras.datasets.mnist.load_data()` from the
repository's copy of MNIST, since these machines cannot download it.

Put this directory on PYTHONPATH to run a Horovod-style script unchanged.
Nothing else is patched.
"""

import os
import sys

_EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def _load_data(path="mnist.npz"):
    sys.path.insert(0, os.path.abspath(_EXAMPLES))
    try:
        from mnist_data import load_mnist
    finally:
        sys.path.pop(0)
    limit = int(os.environ.get("KERASDIST_COMPAT_MNIST_LIMIT", "0")) or None
    (x, y), (xt, yt) = load_mnist()
    return (x[:limit], y[:limit]), (xt, yt)


try:
    import keras

    keras.datasets.mnist.load_data = _load_data
except ImportError:
    pass
