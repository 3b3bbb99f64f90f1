"""kerasdist: distributed data-parallel training for Keras 3 on TensorFlow.

Import it as Horovod's Keras module (`import kerasdist as hvd`): the names
and arguments follow Horovod's.
"""

import os as _os

# `callbacks/` sits at the top of the source tree and is installed as
# `kerasdist.callbacks`. When kerasdist runs from a source checkout (a legacy
# editable install, or PYTHONPATH), make the same import path work.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "callbacks", "__init__.py")) and not any(
    _os.path.isdir(_os.path.join(p, "callbacks")) for p in __path__
):
    __path__.append(_root)

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

import kerasdist.callbacks as callbacks  # noqa: E402  (needs the names above)

__version__ = "0.1.0"
