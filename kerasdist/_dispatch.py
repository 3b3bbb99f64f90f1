"""Public entry points that need no framework, but serve one in use.

`init`, `build_info` and `barrier` are the framework-neutral runtime's
(kerasdist/common). When TensorFlow is already imported, `init` and
`build_info` also load the TensorFlow binding (which sizes TensorFlow's
thread pools and adds its entries to `build_info`), and `barrier` inside a
`tf.function` is the TensorFlow op; when PyTorch is, `init` loads the
PyTorch binding (which sizes PyTorch's thread pool: Keras on the torch
backend). They never import a framework themselves.
"""

import functools
import importlib
import os
import sys

from kerasdist.common import basics, objects


def _tensorflow_in_use():
    return "tensorflow" in sys.modules


def _share_threads_with_later_tensorflow(local_size):
    """Gives TensorFlow, should it start later, this rank's share of the
    cores through the variables it reads when it starts, unless set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    share = str(max(1, cores // max(1, local_size)))
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", share)
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", share)


@functools.wraps(basics.init)
def init(comm=None, process_sets=None):
    basics.init(comm=comm, process_sets=process_sets)
    if "torch" in sys.modules:
        importlib.import_module("kerasdist.torch")  # registers; sizes PyTorch's threads
    if _tensorflow_in_use():
        importlib.import_module("kerasdist.tensorflow")  # registers; sizes the pools
    else:
        _share_threads_with_later_tensorflow(basics.local_size())


@functools.wraps(basics.build_info)
def build_info():
    if _tensorflow_in_use():
        importlib.import_module("kerasdist.tensorflow")
    return basics.build_info()


@functools.wraps(objects.barrier)
def barrier(process_set=None, name=None):
    if _tensorflow_in_use() and not sys.modules["tensorflow"].executing_eagerly():
        from kerasdist.tensorflow import ops

        return ops.barrier(process_set=process_set, name=name)
    return objects.barrier(process_set=process_set, name=name)
