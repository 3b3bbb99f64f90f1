"""Trains the classic MNIST CNN with Keras 3 on the JAX backend,
data-parallel with kerasdist.

Run it on 2 processes, or as a plain single-process script:

    kerasdist-run -np 2 python examples/keras_jax_mnist.py
    python examples/keras_jax_mnist.py

It is `keras_torch_mnist.py` (the same script, its `# kerasdist:` lines
included) with `KERAS_BACKEND=jax`; it needs no TensorFlow. Keras jits its
train step; `kd.DistributedOptimizer` reduces the gradients inside it with
one XLA custom call per step on kerasdist's engine (never
`jax.distributed`, which stays uninitialized). The first-update broadcast
runs before `fit`'s first step. At the end each rank prints a digest of its
weights: they are identical.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # this example is for the JAX backend

from keras_torch_mnist import main  # noqa: E402  (the same script on this backend)

if __name__ == "__main__":
    main()
