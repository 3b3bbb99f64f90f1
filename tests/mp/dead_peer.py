"""A peer that stops responding in the middle of a collective.

Rank 1 freezes itself (SIGSTOP) a few milliseconds into a 64 MiB allreduce,
as a hung or dead process would. Rank 0 must fail within the configured
bounds (KERASDIST_TIMEOUT_SECONDS for a transfer, the stall shutdown for a
negotiation) with an error that names rank 1, never hang. Rank 0 then kills
rank 1 so that the job ends.
"""

import os
import signal
import threading
import time

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main

N = 16 << 20  # float32 elements: 64 MiB


def run():
    r = kd.rank()
    pids = kd.allgather_object(os.getpid())
    x = tf.ones([N])
    np.testing.assert_array_equal(kd.allreduce(x, op=kd.Sum, name="big")[:4].numpy(),
                                  np.full(4, 2.0, np.float32))
    if r == 1:
        threading.Timer(0.003, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    t0 = time.monotonic()
    try:
        kd.allreduce(x, op=kd.Sum, name="big")
    except tf.errors.OpError as e:
        elapsed = time.monotonic() - t0
        log(f"survivor error after {elapsed:.1f} s: {e.message}")
        os.kill(pids[1], signal.SIGKILL)
        return
    raise AssertionError(f"rank {r}: the allreduce succeeded with rank 1 frozen")


main(run)
