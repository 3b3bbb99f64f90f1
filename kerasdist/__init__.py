"""kerasdist: distributed data-parallel training for Keras 3, TensorFlow,
PyTorch and JAX.

Import it as Horovod's Keras module (`import kerasdist as hvd`): the names
and arguments follow Horovod's.

The public names are loaded on first use, so that `import kerasdist` (and
the `kerasdist-run` launcher, `kerasdist.runner`) does not pay for
importing TensorFlow until something needs it.
"""

import importlib
import importlib.machinery
import importlib.util
import os
import sys

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "Compression": "kerasdist._keras.compression",
    "DistributedOptimizer": "kerasdist._keras.optimizer",
    "PartialDistributedOptimizer": "kerasdist._keras.optimizer",
    "load_model": "kerasdist._keras.optimizer",
    "DistributedGradientTape": "kerasdist._keras.tape",
    "PartialDistributedGradientTape": "kerasdist._keras.tape",
    "SyncBatchNormalization": "kerasdist._keras.sync_batch_norm",
    "allgather_object": "kerasdist.common.objects",
    "broadcast_object": "kerasdist.common.objects",
    "broadcast_global_variables": "kerasdist.tensorflow.functions",
    "broadcast_variables": "kerasdist._keras.variables",
    "LinearWarmup": "kerasdist._keras.schedules",
    "scale_learning_rate": "kerasdist._keras.schedules",
    "run": "kerasdist.runner.launch",
    "ProcessSet": "kerasdist.common.process_sets",
    "global_process_set": "kerasdist.common.process_sets",
    "add_process_set": "kerasdist.common.process_sets",
    "remove_process_set": "kerasdist.common.process_sets",
}
for _name in ("Adasum", "Average", "Max", "Min", "Product", "Sum"):
    _EXPORTS[_name] = "kerasdist.common.reduce_ops"  # plain integers, any backend
for _name in ("allgather", "allreduce", "broadcast", "grouped_allreduce", "join"):
    _EXPORTS[_name] = "kerasdist.tensorflow.ops"
for _name in ("alltoall", "broadcast_", "grouped_allgather", "grouped_reducescatter",
              "reducescatter"):
    _EXPORTS[_name] = "kerasdist.tensorflow.collectives"
for _name in ("rank_op", "local_rank_op", "size_op", "local_size_op",
              "process_set_included_op"):
    _EXPORTS[_name] = "kerasdist.tensorflow.queries"
for _name in ("is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built",
              "gloo_enabled", "gloo_built", "nccl_built", "ccl_built", "cuda_built",
              "rocm_built", "ddl_built", "start_timeline", "stop_timeline"):
    _EXPORTS[_name] = "kerasdist.common.queries"
for _name in ("cross_rank", "cross_size", "is_initialized", "local_rank", "local_size",
              "rank", "shutdown", "size", "transport_info"):
    _EXPORTS[_name] = "kerasdist.common.basics"
# Framework-neutral, and they load the TensorFlow binding when TensorFlow
# is already imported (kerasdist/_dispatch.py).
for _name in ("barrier", "build_info", "init"):
    _EXPORTS[_name] = "kerasdist._dispatch"
del _name

__all__ = sorted(list(_EXPORTS) + ["callbacks", "data", "elastic"])


class _SourceCallbacksFinder:
    """Finds `kerasdist.callbacks` in a source checkout.

    `callbacks/` sits at the top of the source tree and setup.py installs it
    as `kerasdist.callbacks`. A legacy editable install (or PYTHONPATH) does
    not apply that mapping; this finder, consulted after the regular ones,
    does, without importing anything until the package is used.
    """

    def __init__(self, init_path):
        self._init = init_path

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "kerasdist.callbacks":
            return None
        return importlib.util.spec_from_file_location(
            fullname, self._init,
            submodule_search_locations=[os.path.dirname(self._init)])


def _attach_source_callbacks():
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.isfile(os.path.join(here, "callbacks", "__init__.py")):
        return  # installed normally
    init = os.path.join(os.path.dirname(here), "callbacks", "__init__.py")
    if not os.path.isfile(init):
        return
    if not any(isinstance(f, _SourceCallbacksFinder) for f in sys.meta_path):
        sys.meta_path.append(_SourceCallbacksFinder(init))


_attach_source_callbacks()


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("__"):
        try:  # a submodule such as `kerasdist.callbacks` or `kerasdist.data`
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'kerasdist' has no attribute '{name}'") from None
    else:
        raise AttributeError(f"module 'kerasdist' has no attribute '{name}'")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
