"""Locates and loads kerasdist's native library.

The library is built by `setup.py`. Loading checks that it exists and that
it was built for the running TensorFlow, and fails with a message that says
how to rebuild; there is no fallback. `load()` gives the framework-neutral
runtime its C entry points (`kerasdist_init`, `kerasdist_topology`, ...)
through ctypes; the TensorFlow binding loads the same file's ops
(`kerasdist.tensorflow.library`).
"""

import ctypes
import glob
import os

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # kerasdist/
_REBUILD = (
    "Rebuild it from the kerasdist source tree with\n"
    "    pip install --no-build-isolation --force-reinstall --no-deps -e .\n"
    "(TensorFlow, mpi4py and an MPI must already be installed: "
    "`pip install tensorflow-cpu==2.21.0 mpi4py mpich`)."
)


def library_path():
    """Returns the path of the op library, or raises ImportError."""
    found = sorted(glob.glob(os.path.join(_HERE, "_kerasdist_ops*.so")))
    if not found:
        raise ImportError(
            "kerasdist's op library (_kerasdist_ops*.so) was not found in "
            f"{_HERE}: kerasdist has not been built. " + _REBUILD
        )
    return found[0]


def built_tf_version():
    try:
        from kerasdist import _build_info
    except ImportError:
        return None
    return _build_info.TF_VERSION


def _import_mpi_bounded():
    """Imports mpi4py.MPI (which runs MPI_Init) within a bound.

    MPI_Init waits for every process of the job to start MPI; a rank that is
    frozen or never starts would hold the others there forever, before any
    kerasdist timeout applies. faulthandler's watchdog runs without the GIL,
    so it fires even while MPI_Init blocks: it prints where each thread is and
    ends the process with exit code 1 after KERASDIST_INIT_TIMEOUT_SECONDS.
    """
    import sys

    if "mpi4py.MPI" in sys.modules:
        return
    import faulthandler

    try:
        bound = float(os.environ.get("KERASDIST_INIT_TIMEOUT_SECONDS") or 300)
    except ValueError:
        bound = 300.0  # init() reports the bad value itself
    if not bound > 0 or bound != bound:
        bound = 300.0
    faulthandler.dump_traceback_later(bound, exit=True)
    try:
        from mpi4py import MPI  # noqa: F401
    finally:
        faulthandler.cancel_dump_traceback_later()


# INTERIM: replaced by the engine library. Today's C entry points live in
# the TensorFlow op library, which links against TensorFlow, and TensorFlow
# must be the first to load it: `tf.load_op_library` collects the ops' Python
# wrappers only from the load that registers them (a later call returns
# them from TensorFlow's cache, which is how the TensorFlow binding gets
# them). This function is the only place in kerasdist.common that imports
# TensorFlow; with a framework-neutral engine library it goes away.
def _load_through_tensorflow(path):
    """Loads `path` with TensorFlow; returns TensorFlow's version."""
    import tensorflow as tf

    built = built_tf_version()
    if built is not None and built != tf.__version__:
        raise ImportError(
            f"kerasdist's op library was built against TensorFlow {built}, "
            f"but TensorFlow {tf.__version__} is installed. Custom ops are "
            "not ABI-compatible across TensorFlow versions. " + _REBUILD
        )
    # mpi4py must load (and initialise) libmpi before the op library, which
    # links against the same libmpi.
    _import_mpi_bounded()

    try:
        tf.load_op_library(path)
    except Exception as e:  # undefined symbols, wrong ABI, ...
        raise ImportError(
            f"kerasdist's op library {path} could not be loaded: {e}. " + _REBUILD
        ) from e
    return tf.__version__


def load():
    """Loads the native library. Returns `(ctypes_library, path)`."""
    path = library_path()
    tf_version = _load_through_tensorflow(path)  # INTERIM
    lib = ctypes.CDLL(path)
    ll = ctypes.c_longlong
    lib.kerasdist_init.argtypes = [
        ctypes.c_int, ll, ll, ll, ll, ll, ll, ll, ctypes.c_int, ctypes.c_char_p,
        ctypes.c_char_p, ll, ctypes.c_int, ll, ll, ll, ll, ll, ll, ctypes.c_char_p, ctypes.c_int,
    ]
    lib.kerasdist_topology.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.kerasdist_add_process_set.argtypes = [
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ll, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lib.kerasdist_remove_process_set.argtypes = [ctypes.c_int]
    lib.kerasdist_exit_guard.argtypes = [ctypes.c_double]
    lib.kerasdist_cache_entries.restype = ll
    lib.kerasdist_direct_ops.restype = ll
    lib.kerasdist_spin_us.restype = ll
    lib.kerasdist_init.restype = ctypes.c_int
    lib.kerasdist_built_tf_version.restype = ctypes.c_char_p
    lib.kerasdist_transport_name.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.kerasdist_built_tf_version.restype = ctypes.c_char_p
    lib_built = lib.kerasdist_built_tf_version().decode()
    if lib_built != tf_version:  # INTERIM, with the TensorFlow load above
        raise ImportError(
            f"kerasdist's op library was built against TensorFlow {lib_built}, "
            f"but TensorFlow {tf_version} is installed. " + _REBUILD
        )
    return lib, path
