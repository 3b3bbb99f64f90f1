"""One MPI_Allreduce through mpi4py, checked exactly (no kerasdist).

Args (argv): the size in MiB (default 16). Used to see that MPICH's
inter-host bytes cross the test hosts' links.
"""

import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
n = int(sys.argv[1] if len(sys.argv) > 1 else 16) * (1 << 20) // 4
x = np.full(n, comm.rank + 1, np.float32)
y = np.empty_like(x)
comm.Allreduce(x, y)
np.testing.assert_array_equal(y, np.full(n, comm.size * (comm.size + 1) / 2, np.float32))
print(f"[rank {comm.rank}] MPI allreduce ok", flush=True)
