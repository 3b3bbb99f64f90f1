"""Build and install kerasdist with its TensorFlow custom-op library.

The op library is compiled against the TensorFlow that is already installed
(custom ops are not ABI-stable across TensorFlow versions or distributions),
so install TensorFlow first and build without isolation:

    pip install tensorflow-cpu==2.21.0 mpi4py mpich
    pip install --no-build-isolation .        # or -e . for development
"""

import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    """The version declared in pyproject.toml (the project's metadata)."""
    import tomllib

    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["version"]


VERSION = _version()


def _fail(msg):
    sys.stderr.write("\nkerasdist build error: " + msg + "\n\n")
    raise SystemExit(1)


def _tensorflow():
    try:
        import tensorflow as tf  # noqa: F401
    except ImportError:
        _fail(
            "TensorFlow is not installed in this Python environment "
            f"({sys.executable}). kerasdist compiles its ops against the "
            "installed TensorFlow, so install it first, then build without "
            "build isolation:\n"
            "    pip install tensorflow-cpu==2.21.0 mpi4py mpich\n"
            "    pip install --no-build-isolation ."
        )
    return tf


def _mpicxx():
    """Finds the MPI C++ wrapper of the environment mpi4py uses."""
    candidates = [os.path.join(os.path.dirname(sys.executable), "mpicxx")]
    try:
        import mpi4py

        cfg = mpi4py.get_config()
        if cfg.get("mpicxx"):
            candidates.append(cfg["mpicxx"])
        if cfg.get("mpicc"):
            candidates.append(cfg["mpicc"])
    except ImportError:
        _fail(
            "mpi4py is not installed. Install it and an MPI first:\n"
            "    pip install mpi4py mpich"
        )
    which = shutil.which("mpicxx")
    if which:
        candidates.append(which)
    for c in candidates:
        if c and os.path.exists(c):
            return c
    _fail(
        "No MPI compiler wrapper (mpicxx) found. Install the MPICH wheel "
        "(`pip install mpich`) or a system MPI with its development files."
    )


def _mpi_flags():
    wrapper = _mpicxx()
    out = subprocess.run(
        [wrapper, "-show"], check=True, capture_output=True, text=True
    ).stdout
    args = shlex.split(out)[1:]  # drop the compiler itself
    cflags = [a for a in args if a.startswith(("-I", "-D"))]
    lflags = [a for a in args if not a.startswith(("-I", "-D"))]
    return wrapper, cflags, lflags


ENGINE_LIBRARY = "libkerasdist.so"
CORE_SOURCES = sorted(glob.glob("kerasdist/csrc/core/*/*.cc")) + sorted(
    glob.glob("kerasdist/csrc/capi/*.cc"))
TF_SOURCES = sorted(glob.glob("kerasdist/csrc/tf/*.cc"))
INCLUDE_DIRS = ["kerasdist/csrc/core", "kerasdist/csrc"]


def _newer(target, inputs):
    return not os.path.exists(target) or any(
        os.path.getmtime(p) > os.path.getmtime(target) for p in inputs)


def _build_engine_library(wrapper, out_dir, temp_dir, jobs):
    """Compiles the C++ core and its C API into libkerasdist.so.

    Framework-free: MPI's flags only. Every binding (the TensorFlow op
    library, ctypes) loads this one library, so a process has one engine.
    """
    headers = glob.glob("kerasdist/csrc/**/*.h", recursive=True)
    flags = ["-std=c++17", "-O3", "-fPIC", "-DNDEBUG", "-pthread",
             "-Wno-sign-compare"] + [f"-I{d}" for d in INCLUDE_DIRS]
    os.makedirs(temp_dir, exist_ok=True)
    objects, todo = [], []
    for src in CORE_SOURCES:
        obj = os.path.join(temp_dir, src.replace("/", "_")[:-3] + ".o")
        objects.append(obj)
        if _newer(obj, [src, __file__] + headers):
            todo.append([wrapper, *flags, "-c", src, "-o", obj])

    def compile_one(cmd):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        return None if proc.returncode == 0 else " ".join(cmd) + "\n" + proc.stderr

    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        errors = [e for e in pool.map(compile_one, todo) if e]
    if errors:
        _fail("compiling the engine library failed:\n" + "\n".join(errors)[-6000:])
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, ENGINE_LIBRARY)
    if todo or not os.path.exists(target):
        # mpicxx adds -lmpi; the rpath finds the same libmpi that mpi4py loads.
        libdirs = [a[2:] for a in _mpi_flags()[2] if a.startswith("-L")]
        rpaths = [f"-Wl,-rpath,{d}" for d in libdirs]
        cmd = [wrapper, "-shared", "-pthread", *objects, "-o", target,
               f"-Wl,-soname,{ENGINE_LIBRARY}", *rpaths]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            _fail("linking the engine library failed:\n" + proc.stderr[-6000:])
    return target


JAX_LIBRARY = "libkerasdist_jax.so"
JAX_SOURCES = sorted(glob.glob("kerasdist/csrc/jax/*.cc"))


def _build_jax_library(out_dir):
    """Compiles the XLA FFI handlers into libkerasdist_jax.so, if JAX is here.

    They include the FFI headers that jaxlib ships (`jax.ffi.include_dir()`)
    and the engine library's C API, and link the engine library beside them.
    Without JAX the JAX binding is simply not built (kerasdist.jax then says
    how to rebuild).
    """
    try:
        import jax.ffi
    except ImportError:
        return None
    target = os.path.join(out_dir, JAX_LIBRARY)
    headers = glob.glob("kerasdist/csrc/capi/*.h")
    if not _newer(target, JAX_SOURCES + headers + [__file__,
                                                   os.path.join(out_dir, ENGINE_LIBRARY)]):
        return target
    cxx = os.environ.get("CXX", "g++")
    cmd = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-DNDEBUG", "-pthread",
           f"-I{jax.ffi.include_dir()}", "-Ikerasdist/csrc", *JAX_SOURCES,
           f"-L{out_dir}", "-l:" + ENGINE_LIBRARY, "-Wl,-rpath,$ORIGIN", "-o", target]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        _fail("compiling the JAX library failed:\n" + " ".join(cmd) + "\n"
              + proc.stderr[-6000:])
    return target


class BuildOps(build_ext):
    """Builds the engine library, then the TensorFlow op library on it."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def copy_extensions_to_source(self):
        # In-place and editable builds load the package from the source tree,
        # where the engine library must sit beside the op library.
        super().copy_extensions_to_source()
        # A new file renamed into place: processes that have the old one
        # mapped keep it intact.
        for built in (self._engine, self._jax):
            if not built:
                continue
            target = os.path.join(HERE, "kerasdist", os.path.basename(built))
            shutil.copy2(built, target + ".tmp")
            os.replace(target + ".tmp", target)

    def build_extensions(self):
        tf = _tensorflow()
        wrapper, _, _ = _mpi_flags()
        out_dir = os.path.dirname(self.get_ext_fullpath("kerasdist._kerasdist_tf"))
        self._engine = _build_engine_library(
            wrapper, out_dir, os.path.join(self.build_temp, "engine"), self.parallel)
        self._jax = _build_jax_library(out_dir)
        # The op library includes only the C API and links the engine library
        # beside it: it compiles no core source.
        cflags = list(tf.sysconfig.get_compile_flags()) + [
            "-O3",
            "-fPIC",
            "-Wno-deprecated-declarations",
            "-Wno-sign-compare",
            "-DNDEBUG",
            f'-DKERASDIST_TF_VERSION="{tf.__version__}"',
        ]
        lflags = list(tf.sysconfig.get_link_flags()) + [
            f"-L{out_dir}", "-l:" + ENGINE_LIBRARY, "-Wl,-rpath,$ORIGIN"]
        for ext in self.extensions:
            ext.extra_compile_args = cflags
            ext.extra_link_args = lflags
        # C++ sources need a C++ driver for compiling and linking.
        cxx = os.environ.get("CXX", "g++")
        self.compiler.set_executable("compiler_so", [cxx] + self.compiler.compiler_so[1:])
        self.compiler.set_executable("compiler_cxx", [cxx])
        self.compiler.set_executable("linker_so", [cxx] + self.compiler.linker_so[1:])
        super().build_extensions()
        info = (
            "# Written by setup.py when the libraries were built.\n"
            f"TF_VERSION = {tf.__version__!r}\n"
            f"MPI_WRAPPER = {wrapper!r}\n"
            f"KERASDIST_VERSION = {VERSION!r}\n"
        )
        # Next to the built library (regular installs) and in the source tree
        # (editable installs load the package from here).
        targets = {
            os.path.join(self.build_lib, "kerasdist"),
            os.path.join(HERE, "kerasdist"),
        }
        for target in targets:
            os.makedirs(target, exist_ok=True)
            with open(os.path.join(target, "_build_info.py"), "w") as f:
                f.write(info)


# The metadata and extras are in pyproject.toml; this adds the native build.
setup(
    packages=["kerasdist", "kerasdist.callbacks", "kerasdist.common",
              "kerasdist.tensorflow", "kerasdist.torch", "kerasdist.torch.elastic", "kerasdist.jax",
              "kerasdist._keras", "kerasdist.runner"],
    package_dir={"kerasdist": "kerasdist", "kerasdist.callbacks": "callbacks"},
    ext_modules=[
        Extension("kerasdist._kerasdist_tf", sources=TF_SOURCES, include_dirs=["kerasdist/csrc"],
                  depends=glob.glob("kerasdist/csrc/**/*.h", recursive=True),
                  language="c++")
    ],
    cmdclass={"build_ext": BuildOps},
)
