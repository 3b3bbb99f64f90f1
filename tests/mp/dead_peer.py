"""A peer that stops responding in the middle of a collective.

Rank 1 freezes itself (SIGSTOP) a quarter into one of a loop of 64 MiB
allreduces (StopInside: never between two of them), as a hung or dead
process would. Rank 0 must fail within the configured bounds
(KERASDIST_TIMEOUT_SECONDS for a transfer, the stall shutdown or the
liveness bound for a negotiation) with an error that names rank 1, never
hang. Rank 0 logs the whole error on one line (the test reads which state
it failed in from it) and then kills rank 1 so that the job ends.
"""

import os
import signal
import time

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import StopInside, log, main

N = 16 << 20  # float32 elements: 64 MiB


def run():
    r = kd.rank()
    pids = kd.allgather_object(os.getpid())
    x = tf.ones([N])
    t0 = time.monotonic()
    np.testing.assert_array_equal(kd.allreduce(x, op=kd.Sum, name="big")[:4].numpy(),
                                  np.full(4, 2.0, np.float32))
    took = time.monotonic() - t0
    calls = StopInside(took) if r == 1 else None
    try:
        for _ in range(200):
            t0 = time.monotonic()
            if calls:
                with calls:
                    kd.allreduce(x, op=kd.Sum, name="big")
            else:
                kd.allreduce(x, op=kd.Sum, name="big")
    except tf.errors.OpError as e:
        elapsed = time.monotonic() - t0
        log(f"survivor error after {elapsed:.1f} s: {' '.join(e.message.split())}")
        os.kill(pids[1], signal.SIGKILL)
        return
    raise AssertionError(f"rank {r}: the allreduce succeeded with rank 1 frozen")


main(run)
