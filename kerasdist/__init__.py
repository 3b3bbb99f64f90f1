"""kerasdist: distributed data-parallel training for Keras 3 on TensorFlow.

Import it as Horovod's Keras module (`import kerasdist as hvd`): the names
and arguments follow Horovod's.
"""

from kerasdist.compression import Compression
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

__version__ = "0.1.0"
