"""kerasdist's JAX binding: collectives on JAX arrays, eagerly and inside
`jax.jit`, on kerasdist's engine.

Import it as `import kerasdist.jax as kd`. Outside `jax.jit` the
collectives run at once through the engine library; inside, they are XLA
FFI custom calls on the CPU, registered with the public `jax.ffi` API, which
XLA runs without blocking its threads. The bytes go through kerasdist's
engine, never through `jax.distributed` nor MPI's own collectives.
"""

from kerasdist.common.basics import (cross_rank, cross_size, init, is_initialized,  # noqa: F401
                                     local_rank, local_size, rank, shutdown, size)
from kerasdist.common.exceptions import HorovodInternalError  # noqa: F401
from kerasdist.common.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                           global_process_set, remove_process_set)
from kerasdist.common.reduce_ops import Average, Max, Min, Product, Sum  # noqa: F401
from kerasdist.jax.collectives import (allgather, allreduce, alltoall, barrier,  # noqa: F401
                                       broadcast, grouped_allreduce, reducescatter)


def _build_info():
    import jax

    return {"jax": jax.__version__}


def _register():
    from kerasdist.common import bindings

    bindings.register(bindings.Binding("jax", build_info=_build_info))


_register()
