"""The engine library: one per process, framework-free, version-checked.

libkerasdist.so holds the core and the C API and links MPI only; the
TensorFlow op library links it and compiles no core source; a binding that
speaks another C API version refuses to load with a clear error.
"""

import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PACKAGE = os.path.join(ROOT, "kerasdist")
BIN = os.path.dirname(sys.executable)


def _one(pattern):
    found = glob.glob(os.path.join(PACKAGE, pattern))
    assert len(found) == 1, found
    return found[0]


def _needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True)
    return [line.split("[")[1].rstrip("]") for line in out.stdout.splitlines()
            if "(NEEDED)" in line]


def _defined(path):
    out = subprocess.run(["nm", "-DC", "--defined-only", path], capture_output=True,
                         text=True, check=True)
    return out.stdout


def test_engine_library_links_mpi_and_no_framework():
    needed = _needed(_one("libkerasdist.so"))
    assert any(n.startswith("libmpi") for n in needed), needed
    assert not [n for n in needed if "tensorflow" in n or "torch" in n or "jax" in n], needed


def test_op_library_reaches_the_engine_only_through_the_c_api():
    op_library = _one("_kerasdist_tf*.so")
    assert "libkerasdist.so" in _needed(op_library)
    assert not [n for n in _needed(op_library) if n.startswith("libmpi")]
    symbols = _defined(op_library)
    for core in ("kerasdist::Engine::", "kerasdist::Coordinator::", "kerasdist::Context::",
                 "kerasdist_enqueue", "kerasdist_init"):
        assert core not in symbols, f"the op library defines {core}"
    engine = _defined(_one("libkerasdist.so"))
    for api in ("kerasdist_api_version", "kerasdist_enqueue", "kerasdist_handle_wait",
                "kerasdist_init", "kerasdist_add_process_set"):
        assert api in engine, api


def test_one_engine_serves_tensorflow_ops_and_c_api_handles_together():
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([os.path.join(BIN, "mpiexec"), "-n", "2", sys.executable,
                          os.path.join(HERE, "mp", "one_engine.py")], env=env,
                         capture_output=True, text=True, timeout=240)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "rank 0: one engine ok" in text and "rank 1: one engine ok" in text, text[-3000:]


def test_a_c_api_version_mismatch_is_a_clear_import_error():
    code = ("from kerasdist.common import library\n"
            "library.API_VERSION = 999\n"
            "try:\n"
            "    library.load()\n"
            "except ImportError as e:\n"
            "    print('IMPORT ERROR:', e)\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "IMPORT ERROR:" in out.stdout and "C API version 1" in out.stdout, out.stdout
    assert "version 999" in out.stdout and "Rebuild it" in out.stdout, out.stdout


def test_engine_header_needs_no_mpi_header():
    # engine.h and the C API compile with a plain C++ compiler and no MPI
    # include path: <mpi.h> stays inside the transports and the Context.
    core = os.path.join(PACKAGE, "csrc", "core")
    for header in ("engine/engine.h", "capi/kerasdist.h"):
        out = subprocess.run(
            ["g++", "-std=c++17", "-fsyntax-only", "-I", core, "-I",
             os.path.join(PACKAGE, "csrc"), "-x", "c++", "-"],
            input=f'#include "{header}"\n', capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (header, out.stderr[-3000:])
