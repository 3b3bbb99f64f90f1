"""Shared by the parity rank scripts: the helpers of tests/mp."""

import os
import sys

import kerasdist as kd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mp"))

from _util import log, main  # noqa: E402,F401


# Horovod's static process sets at np=4: even and odd ranks, given to init().
EVEN = kd.ProcessSet([0, 2])
ODD = kd.ProcessSet([1, 3])


def static_sets():
    """[EVEN, ODD] when mpiexec starts 4 ranks, else None (before init(),
    from the launcher's environment)."""
    size = os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or "1"
    return [EVEN, ODD] if int(size) == 4 else None
