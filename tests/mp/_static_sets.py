"""Horovod's static process sets at np=4 (even and odd ranks, given to init()),
for the graph-mode rank scripts."""

import os

import kerasdist as kd


# Horovod's static process sets at np=4: even and odd ranks, given to init().
EVEN = kd.ProcessSet([0, 2])
ODD = kd.ProcessSet([1, 3])


def static_sets():
    """[EVEN, ODD] when mpiexec starts 4 ranks, else None (before init(),
    from the launcher's environment)."""
    size = os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or "1"
    return [EVEN, ODD] if int(size) == 4 else None
