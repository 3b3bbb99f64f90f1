"""init(comm=[...]) where a listed rank never calls it: the others fail
within KERASDIST_INIT_TIMEOUT_SECONDS naming it, nothing is left behind,
and a normal init() afterwards works (and the job exits cleanly)."""

import time

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import kerasdist as kd
from _util import log

world = MPI.COMM_WORLD
r = world.Get_rank()
if r < 2:
    start = time.monotonic()
    try:
        kd.init(comm=[0, 1, 2])
        raise AssertionError("init(comm) without rank 2 should fail")
    except RuntimeError as e:
        assert "world ranks [2] are in comm=[0, 1, 2]" in str(e), e
    took = time.monotonic() - start
    assert 2.5 < took < 10, took
else:
    time.sleep(4)  # past the others' bound; never calls init(comm)
kd.init()
out = kd.allreduce(tf.fill([4], float(r)), op=kd.Sum, name="after").numpy()
np.testing.assert_array_equal(out, np.full(4, 3.0, np.float32))
log("comm_missing OK")
