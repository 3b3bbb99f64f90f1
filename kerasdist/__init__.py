"""kerasdist: distributed data-parallel training for Keras 3 on TensorFlow.

Import it as Horovod's Keras module (`import kerasdist as hvd`): the names
and arguments follow Horovod's.
"""

from kerasdist.compression import Compression
from kerasdist.optimizer import DistributedOptimizer, load_model
from kerasdist.functions import allgather_object, broadcast_object, broadcast_variables
from kerasdist.ops import (
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allreduce,
    barrier,
    broadcast,
    grouped_allreduce,
    join,
)
from kerasdist.runtime import (
    build_info,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)

from kerasdist import data  # noqa: E402
from kerasdist.launch import run  # noqa: E402
from kerasdist.schedules import LinearWarmup, scale_learning_rate  # noqa: E402


def _attach_source_callbacks():
    """Makes `kerasdist.callbacks` importable from a source checkout.

    `callbacks/` sits at the top of the source tree and setup.py installs it
    as `kerasdist.callbacks`. A legacy editable install (or PYTHONPATH) does
    not apply that mapping, so load the directory under that name here.
    """
    import importlib.util
    import os
    import sys

    if importlib.util.find_spec("kerasdist.callbacks") is not None:
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    init = os.path.join(root, "callbacks", "__init__.py")
    if not os.path.isfile(init):
        return
    spec = importlib.util.spec_from_file_location(
        "kerasdist.callbacks", init,
        submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["kerasdist.callbacks"] = module
    spec.loader.exec_module(module)


_attach_source_callbacks()
import kerasdist.callbacks as callbacks  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Average", "Compression", "DistributedOptimizer", "LinearWarmup", "Max", "Min", "Product", "Sum",
    "allgather", "allgather_object", "allreduce", "barrier", "broadcast",
    "broadcast_object", "broadcast_variables", "build_info", "callbacks", "data", "cross_rank",
    "cross_size", "grouped_allreduce", "init", "is_initialized", "join", "load_model",
    "local_rank", "local_size", "rank", "run", "scale_learning_rate", "shutdown", "size",
]
