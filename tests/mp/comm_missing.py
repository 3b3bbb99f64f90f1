"""init(comm=[...]) where a listed rank never calls it: the others fail
within KERASDIST_INIT_TIMEOUT_SECONDS naming it, nothing is left behind,
and a normal init() afterwards works (and the job exits cleanly).

The ranks start together (a barrier: importing TensorFlow takes seconds
longer on some ranks than others on a loaded machine), and rank 2 calls
the normal init() only once ranks 0 and 1 say their init(comm) has failed,
so that every rank's init() starts within the others' bound."""

import time

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import kerasdist as kd
from _util import log

FAILED_TAG = 7302
world = MPI.COMM_WORLD
r = world.Get_rank()
world.Barrier()
if r < 2:
    start = time.monotonic()
    try:
        kd.init(comm=[0, 1, 2])
        raise AssertionError("init(comm) without rank 2 should fail")
    except RuntimeError as e:
        assert "world ranks [2] are in comm=[0, 1, 2]" in str(e), e
    took = time.monotonic() - start
    assert 2.5 < took < 10, took
    world.send("init(comm) failed", dest=2, tag=FAILED_TAG)
else:
    # Never calls init(comm); waits (bounded) until the others gave up on it.
    deadline = time.monotonic() + 60
    for peer in (0, 1):
        req = world.irecv(source=peer, tag=FAILED_TAG)
        while not req.test()[0]:
            assert time.monotonic() < deadline, f"rank {peer} never finished init(comm)"
            time.sleep(0.01)
kd.init()
out = kd.allreduce(tf.fill([4], float(r)), op=kd.Sum, name="after").numpy()
np.testing.assert_array_equal(out, np.full(4, 3.0, np.float32))
log("comm_missing OK")
