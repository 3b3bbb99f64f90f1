"""kerasdist's TensorFlow op library, and TensorFlow's set-up for the engine.

`raw_ops()` gives the ops' generated Python wrappers (`kerasdist_allreduce`,
...), loaded with `tf.load_op_library` when the first op is used. The op
library (`_kerasdist_tf*.so`) holds only the kernels: it reaches the engine
through the engine library's C API, which the runtime has loaded already
(kerasdist/common/library.py), so TensorFlow, PyTorch and JAX bindings in one
process share one engine. Loading checks that the op library was built for
the running TensorFlow and speaks the engine library's C API version.

`after_init()` runs at the end of every `init()` (and when this binding is
imported after one): it gives each local rank its share of the cores for
TensorFlow's thread pools. `build_info()` gives the binding's entries of
`kerasdist.build_info()`.
"""

import ctypes
import os

import tensorflow as tf

from kerasdist.common import library
from kerasdist.common.context import context

_RAW_OPS = []  # the loaded module, once loaded
_BUILT = []  # the TensorFlow version it was built against


def op_library_path():
    """Returns the path of the TensorFlow op library, or raises ImportError."""
    return library.find("_kerasdist_tf*.so", "TensorFlow op library")


def _check(path):
    """Checks the built op library against TensorFlow and the C API."""
    oplib = ctypes.CDLL(path)
    oplib.kerasdist_tf_api_version.restype = ctypes.c_int32
    oplib.kerasdist_built_tf_version.restype = ctypes.c_char_p
    version = oplib.kerasdist_tf_api_version()
    if version != library.API_VERSION:
        raise ImportError(
            f"kerasdist's TensorFlow op library {path} was built against C API "
            f"version {version}, but the engine library speaks version "
            f"{library.API_VERSION}. " + library.REBUILD)
    built = oplib.kerasdist_built_tf_version().decode()
    if built != tf.__version__:
        raise ImportError(
            f"kerasdist's TensorFlow op library was built against TensorFlow {built}, "
            f"but TensorFlow {tf.__version__} is installed. Custom ops are not "
            "ABI-compatible across TensorFlow versions. " + library.REBUILD)
    return built


def raw_ops():
    """Returns the Python wrappers of kerasdist's TensorFlow ops.

    Raises:
        ImportError: If the op library is missing, was built for another
            TensorFlow or C API version, or TensorFlow cannot load it.
    """
    if not _RAW_OPS:
        path = op_library_path()
        # The engine library first: the op library links against it.
        context.lib  # noqa: B018  (loaded with the runtime's context)
        try:
            ops = tf.load_op_library(path)
        except Exception as e:  # undefined symbols, wrong ABI, ...
            raise ImportError(
                f"kerasdist's op library {path} could not be loaded by "
                f"TensorFlow: {e}. " + library.REBUILD) from e
        _BUILT.append(_check(path))
        _RAW_OPS.append(ops)
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
        "tf_built_against": _BUILT[0],
        "op_library_path": op_library_path(),
        "ops": ops,
    }
