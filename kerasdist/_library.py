"""Locates and loads kerasdist's compiled op library.

The library is built by `setup.py` against the installed TensorFlow. Loading
checks that it exists and that it was built for the running TensorFlow, and
fails with a message that says how to rebuild; there is no fallback.
"""

import ctypes
import glob
import os

import tensorflow as tf

_HERE = os.path.dirname(os.path.abspath(__file__))
_REBUILD = (
    "Rebuild it from the kerasdist source tree with\n"
    "    pip install --no-build-isolation --force-reinstall --no-deps -e .\n"
    "(TensorFlow, mpi4py and an MPI must already be installed: "
    "`pip install tensorflow-cpu==2.21.0 mpi4py mpich`)."
)


# The C API version (KERASDIST_API_VERSION in csrc/capi/kerasdist.h) this
# Python code speaks.
API_VERSION = 1
ENGINE_LIBRARY = "libkerasdist.so"


def _find(pattern, what):
    found = sorted(glob.glob(os.path.join(_HERE, pattern)))
    if not found:
        raise ImportError(
            f"kerasdist's {what} ({pattern}) was not found in {_HERE}: kerasdist "
            "has not been built. " + _REBUILD
        )
    return found[0]


def library_path():
    """Returns the path of the TensorFlow op library, or raises ImportError."""
    return _find("_kerasdist_tf*.so", "TensorFlow op library")


def engine_library_path():
    """Returns the path of the engine library, or raises ImportError."""
    return _find(ENGINE_LIBRARY, "engine library")


class Config(ctypes.Structure):
    """`kerasdist_config` of the C API."""

    _fields_ = [
        ("struct_size", ctypes.c_int32),
        ("fusion_threshold_bytes", ctypes.c_int64),
        ("fusion_tensor_limit_bytes", ctypes.c_int64),
        ("cycle_time_us", ctypes.c_int64),
        ("stall_warning_us", ctypes.c_int64),
        ("stall_shutdown_us", ctypes.c_int64),
        ("deadlock_us", ctypes.c_int64),
        ("timeout_ms", ctypes.c_int64),
        ("init_timeout_ms", ctypes.c_int64),
        ("segment_bytes", ctypes.c_int64),
        ("cache_capacity", ctypes.c_int64),
        ("small_allreduce_bytes", ctypes.c_int64),
        ("spin_us", ctypes.c_int64),
        ("direct_allreduce_bytes", ctypes.c_int64),
        ("direct_group_bytes", ctypes.c_int64),
        ("shared_memory", ctypes.c_int32),
        ("hierarchical", ctypes.c_int32),
        ("timeline_path", ctypes.c_char_p),
        ("version", ctypes.c_char_p),
    ]


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


def load():
    """Loads the op library. Returns `(ops_module, ctypes_library, path)`."""
    path = library_path()
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

    lib = load_engine()
    try:
        ops = tf.load_op_library(path)
    except Exception as e:  # undefined symbols, wrong ABI, ...
        raise ImportError(
            f"kerasdist's op library {path} could not be loaded: {e}. " + _REBUILD
        ) from e
    oplib = ctypes.CDLL(path)
    oplib.kerasdist_tf_api_version.restype = ctypes.c_int32
    oplib.kerasdist_built_tf_version.restype = ctypes.c_char_p
    if oplib.kerasdist_tf_api_version() != API_VERSION:
        raise ImportError(
            f"kerasdist's op library {path} speaks C API version "
            f"{oplib.kerasdist_tf_api_version()}, but the engine library speaks "
            f"{API_VERSION}. " + _REBUILD
        )
    lib_built = oplib.kerasdist_built_tf_version().decode()
    if lib_built != tf.__version__:
        raise ImportError(
            f"kerasdist's op library was built against TensorFlow {lib_built}, "
            f"but TensorFlow {tf.__version__} is installed. " + _REBUILD
        )
    lib.kerasdist_built_tf_version = oplib.kerasdist_built_tf_version
    return ops, lib, path


def load_engine():
    """Loads the engine library (no framework) and checks its C API version."""
    _import_mpi_bounded()
    path = engine_library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            f"kerasdist's engine library {path} could not be loaded: {e}. " + _REBUILD
        ) from e
    lib.kerasdist_api_version.restype = ctypes.c_int32
    version = lib.kerasdist_api_version()
    if version != API_VERSION:
        raise ImportError(
            f"kerasdist's engine library {path} has C API version {version}, but "
            f"this kerasdist expects {API_VERSION}. " + _REBUILD
        )
    i32, ll, char_p = ctypes.c_int32, ctypes.c_longlong, ctypes.c_char_p
    lib.kerasdist_config_defaults.argtypes = [ctypes.POINTER(Config)]
    lib.kerasdist_config_defaults.restype = None
    lib.kerasdist_init.argtypes = [i32, ctypes.POINTER(Config), char_p, i32]
    lib.kerasdist_init.restype = i32
    lib.kerasdist_topology.argtypes = [ctypes.POINTER(i32)]
    lib.kerasdist_add_process_set.argtypes = [
        i32, i32, i32, i32, ctypes.c_int64, char_p, char_p, i32]
    lib.kerasdist_add_process_set.restype = i32
    lib.kerasdist_remove_process_set.argtypes = [i32]
    lib.kerasdist_process_set_info.argtypes = [i32, ctypes.POINTER(i32), ctypes.POINTER(i32)]
    lib.kerasdist_check_process_set.argtypes = [i32, char_p, i32]
    lib.kerasdist_exit_guard.argtypes = [ctypes.c_double]
    lib.kerasdist_cache_entries.restype = ll
    lib.kerasdist_direct_ops.restype = ll
    lib.kerasdist_spin_us.restype = ll
    lib.kerasdist_transport_name.argtypes = [char_p, i32]
    return lib
