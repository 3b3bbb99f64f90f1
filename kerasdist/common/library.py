"""Locates and loads kerasdist's engine library, `libkerasdist.so`.

The engine library is the C++ core with its C API
(kerasdist/csrc/capi/kerasdist.h). It links MPI and no framework, so the
framework-neutral runtime loads it through ctypes without importing one;
every framework binding reaches the same library, so a process has one
engine. `load()` checks that the library exists and speaks this package's
C API version, and fails with a message that says how to rebuild; there is
no fallback.
"""

import ctypes
import glob
import os

# The C API version (KERASDIST_API_VERSION) this Python code speaks.
API_VERSION = 1
ENGINE_LIBRARY = "libkerasdist.so"

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # kerasdist/
REBUILD = (
    "Rebuild it from the kerasdist source tree with\n"
    "    pip install --no-build-isolation --force-reinstall --no-deps -e .\n"
    "(TensorFlow, mpi4py and an MPI must already be installed: "
    "`pip install tensorflow-cpu==2.21.0 mpi4py mpich`)."
)


def find(pattern, what):
    """The path of the built file `pattern` in the package, or ImportError."""
    found = sorted(glob.glob(os.path.join(PACKAGE_DIR, pattern)))
    if not found:
        raise ImportError(
            f"kerasdist's {what} ({pattern}) was not found in {PACKAGE_DIR}: "
            "kerasdist has not been built. " + REBUILD
        )
    return found[0]


def library_path():
    """Returns the path of the engine library, or raises ImportError."""
    return find(ENGINE_LIBRARY, "engine library")


class Config(ctypes.Structure):
    """The C API's `kerasdist_config`."""

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


ALLOCATE_FN = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
    ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p))
DONE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p)


class Request(ctypes.Structure):
    """The C API's `kerasdist_request`: one tensor of a collective."""

    _fields_ = [
        ("struct_size", ctypes.c_int32),
        ("op", ctypes.c_int32),
        ("name", ctypes.c_char_p),
        ("process_set", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("input", ctypes.c_void_p),
        ("output", ctypes.c_void_p),
        ("reduce_op", ctypes.c_int32),
        ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double),
        ("root", ctypes.c_int32),
        ("nsplits", ctypes.c_int32),
        ("splits", ctypes.POINTER(ctypes.c_int64)),
        ("received_splits", ctypes.POINTER(ctypes.c_int32)),
        ("join_result", ctypes.POINTER(ctypes.c_int32)),
        ("allocate", ALLOCATE_FN),
        ("allocate_user", ctypes.c_void_p),
    ]


def import_mpi_bounded():
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


def _declare(lib):
    """Gives the C API's functions their ctypes signatures."""
    i32, i64, ll, char_p, void_p = (ctypes.c_int32, ctypes.c_int64, ctypes.c_longlong,
                                    ctypes.c_char_p, ctypes.c_void_p)
    signatures = {
        "kerasdist_api_version": ([], i32),
        "kerasdist_config_defaults": ([ctypes.POINTER(Config)], None),
        "kerasdist_init": ([i32, ctypes.POINTER(Config), char_p, i32], i32),
        "kerasdist_shutdown": ([], i32),
        "kerasdist_is_initialized": ([], i32),
        "kerasdist_rank": ([], i32),
        "kerasdist_size": ([], i32),
        "kerasdist_topology": ([ctypes.POINTER(i32)], i32),
        "kerasdist_add_process_set": ([i32, i32, i32, i32, i64, char_p, char_p, i32], i32),
        "kerasdist_remove_process_set": ([i32], i32),
        "kerasdist_process_set_info": ([i32, ctypes.POINTER(i32), ctypes.POINTER(i32)], i32),
        "kerasdist_check_process_set": ([i32, char_p, i32], i32),
        "kerasdist_exit_guard": ([ctypes.c_double], i32),
        "kerasdist_transport_name": ([char_p, i32], i32),
        "kerasdist_cache_entries": ([], ll),
        "kerasdist_direct_ops": ([], ll),
        "kerasdist_spin_us": ([], ll),
        "kerasdist_enqueue": ([ctypes.POINTER(Request), i32, char_p, ctypes.c_uint32,
                               void_p, void_p], void_p),  # done: a DONE_FN or None
        "kerasdist_handle_poll": ([void_p], i32),
        "kerasdist_handle_wait": ([void_p, i64], i32),
        "kerasdist_handle_status": ([void_p, char_p, i32], i32),
        "kerasdist_handle_shape": ([void_p, i32, ctypes.POINTER(i64), i32], i32),
        "kerasdist_handle_copy_output": ([void_p, i32, void_p, i64], i32),
        "kerasdist_handle_received_splits": ([void_p, i32, ctypes.POINTER(i32), i32], i32),
        "kerasdist_handle_join_result": ([void_p], i32),
        "kerasdist_handle_release": ([void_p], None),
    }
    for name, (argtypes, restype) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype


def load():
    """Loads the engine library. Returns `(ctypes_library, path)`.

    Raises:
        ImportError: If it is missing, cannot be loaded, or speaks another
            C API version than this package.
    """
    # mpi4py must load (and initialise) libmpi before the engine library,
    # which links against the same libmpi.
    import_mpi_bounded()
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            f"kerasdist's engine library {path} could not be loaded: {e}. " + REBUILD
        ) from e
    try:
        lib.kerasdist_api_version.restype = ctypes.c_int32
        version = lib.kerasdist_api_version()
    except AttributeError:
        version = None
    if version != API_VERSION:
        raise ImportError(
            f"kerasdist's engine library {path} speaks C API version {version}, "
            f"but this kerasdist speaks version {API_VERSION}. " + REBUILD
        )
    _declare(lib)
    return lib, path
