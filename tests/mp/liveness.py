"""Deadlocks, slow ranks and silent ranks, with the default abort rules.

argv[1] selects the case (run with KERASDIST_DEADLOCK_TIME_SECONDS=3 and
KERASDIST_TIMEOUT_SECONDS=3):
- deadlock: rank 0 calls allgather_object while the others are in an
  allreduce, as when one rank leaves fit() early. Every rank fails with an
  error that names what each rank waits on.
- slow: rank 0 works (sleeps) for 8 s before its allreduce while the others
  wait. That is a slow rank, not a deadlock: everything succeeds.
- frozen_root: rank 0 stops (SIGSTOP) while the others wait on it; they fail
  naming rank 0, within the liveness bound.
- frozen_worker: the last rank stops before its allreduce; rank 0 (and the
  others) fail naming it.

In the frozen cases the first survivor then kills the frozen rank so that
the job ends, but only once every survivor has logged its error (a message
over MPI): a rank killed by a signal makes mpiexec end the job at once, which
could cut off a survivor that was a few milliseconds behind.
"""

import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import kerasdist as kd
from kerasdist.common.handles import CollectiveError
from _util import log, main


def expect_abort(fn, *needles):
    start = time.monotonic()
    try:
        fn()
    except (tf.errors.OpError, CollectiveError) as e:
        # TensorFlow ops raise OpError; the object collectives, which run
        # without TensorFlow, raise the runtime's CollectiveError.
        message = getattr(e, "message", None) or str(e)
        for needle in needles:
            assert needle in message, (needle, message)
        log(f"failed as expected after {time.monotonic() - start:.1f} s: {message}")
        return
    raise AssertionError("the collective returned")


def end_frozen(pids, frozen):
    """Once every survivor has logged its error, the first one kills `frozen`."""
    comm = MPI.COMM_WORLD
    survivors = [r for r in range(kd.size()) if r != frozen]
    if kd.rank() != survivors[0]:
        comm.send("logged", dest=survivors[0], tag=7301)
        return
    deadline = time.monotonic() + 30  # bounded: never hang on a lost survivor
    for peer in survivors[1:]:
        req = comm.irecv(source=peer, tag=7301)
        while not req.test()[0]:
            if time.monotonic() > deadline:
                req.Cancel()
                log(f"rank {peer} never said it logged its error")
                break
            time.sleep(0.01)
    os.kill(pids[frozen], signal.SIGKILL)


def run():
    size, r = kd.size(), kd.rank()
    case = sys.argv[1]
    pids = kd.allgather_object(os.getpid())
    if case == "deadlock":
        if r == 0:
            expect_abort(lambda: kd.allgather_object({"done": True}), "Deadlock",
                         "Rank 0 waits on allgather", "Rank 1 waits on allreduce 'step.grad'")
        else:
            expect_abort(lambda: kd.allreduce(tf.ones([8]), name="step.grad"),
                         "Deadlock", "Rank 0 waits on allgather")
    elif case == "slow":
        if r == 0:
            time.sleep(8)
        out = kd.allreduce(tf.ones([8]), op=kd.Sum, name="slow.tensor")
        np.testing.assert_array_equal(out.numpy(), np.full(8, size, np.float32))
        log("slow rank tolerated")
    elif case == "frozen_root":
        if r == 0:
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            expect_abort(lambda: kd.allreduce(tf.ones([8]), name="wait.root"),
                         "rank 0 (host", "has not answered")
            end_frozen(pids, 0)
    elif case == "frozen_worker":
        last = size - 1
        if r == last:
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            expect_abort(lambda: kd.allreduce(tf.ones([8]), name="wait.worker"),
                         f"rank {last} (host", "has not answered")
            end_frozen(pids, last)
    else:
        raise ValueError(case)


main(run)
