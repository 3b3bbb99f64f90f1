"""`kerasdist-run --check-build`: how kerasdist was built."""

import sys


def check_build():
    """Prints how kerasdist was built; returns 0, or 1 if its ops don't load."""
    try:
        import kerasdist
        import kerasdist.tensorflow  # noqa: F401  (imports TensorFlow, loads the ops)

        info = kerasdist.build_info()
        if not info.get("ops") or not info.get("library_path"):
            raise RuntimeError(f"build_info() reports no op library: {info}")
    except Exception as e:  # Whatever the failure, the build is unusable.
        print(f"kerasdist-run: error: The kerasdist op library is not loadable. "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    try:
        import mpi4py

        if "mpi4py.MPI" not in sys.modules:  # No need to initialize MPI.
            mpi4py.rc.initialize = mpi4py.rc.finalize = False
        from mpi4py import MPI

        mpi4py_mpi = MPI.Get_library_version().strip().splitlines()[0]
    except Exception as e:
        mpi4py_mpi = f"unavailable ({type(e).__name__}: {e})"
    tf_built = info.get("tf_built_against")
    print(f"kerasdist {info.get('kerasdist_version')}\n"
          f"  TensorFlow:              {info.get('tf_version')} "
          f"(built against {tf_built})\n"
          f"  MPI library (kerasdist): {info.get('mpi_library')}\n"
          f"  MPI library (mpi4py):    {mpi4py_mpi}\n"
          f"  Engine library:          {info.get('library_path')} "
          f"(C API {info.get('c_api_version')})\n"
          f"  Op library:              {info.get('op_library_path')}\n"
          f"  Ops:                     {', '.join(info['ops'])}")
    if tf_built != info.get("tf_version"):
        print(f"kerasdist-run: warning: kerasdist was built against TensorFlow "
              f"{tf_built} but TensorFlow {info.get('tf_version')} is running.",
              file=sys.stderr)
    return 0
