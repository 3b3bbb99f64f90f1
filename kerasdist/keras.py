"""Horovod's `horovod.tensorflow.keras` module for Keras 3.

`import kerasdist.keras as hvd` gives the names of `import kerasdist as hvd`
(`DistributedOptimizer`, `callbacks`, `init`, ...) except that, as in
Horovod's Keras module, `allreduce`, `allgather`, `broadcast` and
`reducescatter` work on values: they take numpy arrays (or anything
`np.asarray` accepts) and return numpy arrays. `load_model` and
`broadcast_global_variables` have Horovod's Keras signatures.
"""

import numpy as np
import tensorflow as tf

from kerasdist import *  # noqa: F401,F403
from kerasdist import callbacks  # noqa: F401
from kerasdist._keras import first_update as _first_update
from kerasdist._keras.optimizer import load_model  # noqa: F401  (Horovod's signature)
from kerasdist.common.context import check_initialized, context
from kerasdist.tensorflow import collectives as _collectives
from kerasdist.tensorflow import ops as _ops
from kerasdist.tensorflow.compression import Compression


def _numpy(tensor):
    return np.asarray(tensor.numpy() if hasattr(tensor, "numpy") else tensor)


def allreduce(value, name=None, average=None, prescale_factor=1.0,
              postscale_factor=1.0, op=None, compression=Compression.none):
    """Reduces a value over all ranks; returns a numpy array.

    Args:
        value: A numpy array, number or tensor.
        name: Name that matches this collective across ranks. Defaults to
            `None`.
        average: Deprecated: True means `op=Average`, False `op=Sum`.
            Defaults to `None`.
        prescale_factor: Multiplies the input first. Defaults to 1.0.
        postscale_factor: Multiplies the result. Defaults to 1.0.
        op: `kerasdist.Average`, `Sum`, `Min`, `Max` or `Product`. Defaults
            to `None` (`Average`).
        compression: Wire compression. Defaults to `Compression.none`.

    Returns:
        A numpy array of the value's shape and dtype.

    Example:

    >>> hvd.allreduce(np.array([1.0, 2.0]), op=hvd.Sum)  # doctest: +SKIP
    """
    out = _ops.allreduce(tf.convert_to_tensor(value), op=op, name=name,
                         prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor,
                         compression=compression, average=average)
    return _numpy(out)


def allgather(value, name=None):
    """Concatenates every rank's value along the first dimension; returns a
    numpy array.

    Args:
        value: A numpy array (or tensor) with at least one dimension.
        name: Name that matches this collective across ranks. Defaults to
            `None`.

    Returns:
        A numpy array.
    """
    return _numpy(_ops.allgather(tf.convert_to_tensor(value), name=name))


def broadcast(value, root_rank, name=None):
    """Returns `root_rank`'s value on every rank, as a numpy array.

    Args:
        value: A numpy array, number or tensor.
        root_rank: The sending rank.
        name: Name that matches this collective across ranks. Defaults to
            `None`.

    Returns:
        A numpy array.
    """
    return _numpy(_ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name))


def reducescatter(value, name=None, op=_ops.Average):
    """Reduces a value over all ranks and returns this rank's rows, as a
    numpy array.

    Args:
        value: A numpy array (or tensor) with at least one dimension, of the
            same shape on every rank.
        name: Name that matches this collective across ranks. Defaults to
            `None`.
        op: `kerasdist.Average` or `kerasdist.Sum`. Defaults to `Average`.

    Returns:
        A numpy array: this rank's rows of the result (the first `d % size`
        ranks get one row more, as in Horovod).

    Example:

    >>> hvd.reducescatter(np.ones([4, 2]), op=hvd.Sum)  # doctest: +SKIP
    """
    return _numpy(_collectives.reducescatter(tf.convert_to_tensor(value), op=op, name=name))


def broadcast_global_variables(root_rank):
    """Broadcasts model and optimizer state from `root_rank`, for every model
    trained with a `DistributedOptimizer`.

    Keras 3 has no collection of global variables, so this covers what
    kerasdist knows: each `DistributedOptimizer` (in creation order) and the
    variables it trains. For an optimizer that has updated already, they are
    broadcast now; for one that has not, at its first update (when its
    variables become known), before the update. Call it on every rank.
    Non-trainable model variables (BatchNormalization statistics) are only
    covered by `callbacks.BroadcastGlobalVariablesCallback` or
    `broadcast_variables(model.variables, root_rank)`.

    Args:
        root_rank: The rank whose values are kept.

    Example:

    >>> model.compile(optimizer=hvd.DistributedOptimizer(opt), loss="mse")  # doctest: +SKIP
    >>> hvd.broadcast_global_variables(0)  # doctest: +SKIP
    """
    check_initialized()
    if not isinstance(root_rank, int) or not 0 <= root_rank < context.size:
        raise ValueError(
            "Invalid value for argument `root_rank`. Expected an integer in "
            f"[0, {context.size}). Received: root_rank={root_rank!r}")
    _first_update.broadcast_global_variables(root_rank)
