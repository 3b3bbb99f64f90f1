"""kerasdist's PyTorch binding: Horovod's `horovod.torch` API on CPU
tensors, on kerasdist's engine.

Import it as Horovod's torch module (`import kerasdist.torch as hvd`): the
names, arguments and semantics follow `horovod.torch` 0.28.1. The bytes go
through kerasdist's engine library (its C API), never through
`torch.distributed` nor MPI's own collectives. Importing it registers the
binding with the framework-neutral runtime, which sizes PyTorch's thread
pool to this rank's share of the cores at `init()` unless
`OMP_NUM_THREADS` is set.
"""

import os

import torch

from kerasdist.common import bindings as _bindings
from kerasdist.common.basics import (cross_rank, cross_size, init, is_initialized,  # noqa: F401
                                     local_rank, local_size, rank, shutdown, size)
from kerasdist.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from kerasdist.common.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                           global_process_set, remove_process_set)
from kerasdist.common.queries import (ccl_built, cuda_built, ddl_built,  # noqa: F401
                                      gloo_built, gloo_enabled, is_homogeneous,
                                      mpi_built, mpi_enabled, mpi_threads_supported,
                                      nccl_built, rocm_built, start_timeline,
                                      stop_timeline)
from kerasdist.torch import elastic  # noqa: F401
from kerasdist.torch.collectives import (allgather, allreduce, allreduce_,  # noqa: F401
                                         alltoall, broadcast, broadcast_,
                                         grouped_allgather, grouped_allreduce,
                                         grouped_allreduce_, grouped_reducescatter,
                                         reducescatter)
from kerasdist.torch.compression import Compression  # noqa: F401
from kerasdist.torch.functions import (allgather_object, broadcast_object,  # noqa: F401
                                       broadcast_optimizer_state, broadcast_parameters)
from kerasdist.torch.handles import poll, synchronize  # noqa: F401
from kerasdist.torch.mpi_ops import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401
                                     allgather_async, allreduce_async, allreduce_async_,
                                     alltoall_async, barrier, broadcast_async,
                                     broadcast_async_, grouped_allgather_async,
                                     grouped_allreduce_async, grouped_allreduce_async_,
                                     grouped_reducescatter_async, join,
                                     reducescatter_async, sparse_allreduce_async)
from kerasdist.torch.optimizer import DistributedOptimizer  # noqa: F401
from kerasdist.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401


def _after_init(ctx):
    """Gives PyTorch's intra-op pool this rank's share of the cores (as
    the TensorFlow binding does), unless the user chose a number."""
    if "OMP_NUM_THREADS" in os.environ or "KERASDIST_TORCH_THREADS" in os.environ:
        threads = os.environ.get("KERASDIST_TORCH_THREADS")
        if threads:
            torch.set_num_threads(max(1, int(threads)))
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    torch.set_num_threads(max(1, cores // max(1, ctx.local_size or 1)))


def _build_info():
    return {"torch": torch.__version__}


_bindings.register(_bindings.Binding("torch", after_init=_after_init,
                                     build_info=_build_info))
