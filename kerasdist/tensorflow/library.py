"""kerasdist's TensorFlow op library, and TensorFlow's set-up for the engine.

`raw_ops()` gives the ops' generated Python wrappers (`kerasdist_allreduce`,
...), loaded with `tf.load_op_library` when the first op is used. The
file is the native library that the runtime loads (`context.library_path`),
so its checks (built, and for this TensorFlow) have passed already.

`after_init()` runs at the end of every `init()` (and when this binding is
imported after one): it gives each local rank its share of the cores for
TensorFlow's thread pools. `build_info()` gives the binding's entries of
`kerasdist.build_info()`.
"""

import os

import tensorflow as tf

from kerasdist.common.context import context

_RAW_OPS = []  # the loaded module, once loaded


def raw_ops():
    """Returns the Python wrappers of kerasdist's TensorFlow ops.

    Raises:
        ImportError: If TensorFlow cannot load the op library.
    """
    if not _RAW_OPS:
        path = context.library_path
        try:
            _RAW_OPS.append(tf.load_op_library(path))
        except Exception as e:  # undefined symbols, wrong ABI, ...
            raise ImportError(
                f"kerasdist's op library {path} could not be loaded by "
                f"TensorFlow: {e}") from e
    return _RAW_OPS[0]


def set_thread_pools(local_size):
    """Gives each local rank a fair share of the cores, unless the user set
    the pools already or TensorFlow has started using them."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    share = max(1, cores // max(1, local_size))
    threading = tf.config.threading
    try:
        if threading.get_intra_op_parallelism_threads() == 0:
            threading.set_intra_op_parallelism_threads(share)
        if threading.get_inter_op_parallelism_threads() == 0:
            # One inter-op thread per core share: extra inter-op threads
            # spin while idle and starve the engine thread of CPU.
            threading.set_inter_op_parallelism_threads(share)
    except RuntimeError:
        pass  # TensorFlow is already initialised; keep its pools.


def after_init(ctx):
    """The binding's step at the end of `init()`, once the engine runs."""
    set_thread_pools(ctx.local_size)


def build_info():
    """The binding's entries of `kerasdist.build_info()`: TensorFlow's
    version, the one the library was built against, and the ops."""
    ops = sorted(name for name in dir(raw_ops()) if name.startswith("kerasdist_"))
    return {
        "tf_version": tf.__version__,
        "tf_built_against": context.lib.kerasdist_built_tf_version().decode(),
        "ops": ops,
    }
