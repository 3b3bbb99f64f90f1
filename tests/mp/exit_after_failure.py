"""A process whose collective failed still exits, within a bound and with a
non-zero code, even though its peer is frozen and MPI_Finalize would wait
for it forever. Rank 1 freezes itself a quarter into one of a loop of 64 MiB
allreduces (StopInside: never between two of them) and is never killed by
the test: the job must end on its own.

Rank 0 is then normally inside the ring's transfers; if rank 1 stopped
before its request reached rank 0, rank 0 negotiates. Either way one of its
allreduces fails, and it prints the whole error on one line, for the test to
check the state it failed in and that the error names rank 1 as lost.
"""

import time

import tensorflow as tf

import kerasdist as kd
from _util import StopInside

kd.init()
r = kd.rank()
x = tf.ones([16 << 20])
start = time.monotonic()
kd.allreduce(x, name="big")
calls = StopInside(time.monotonic() - start) if r == 1 else None
try:
    for _ in range(200):
        if calls:
            with calls:
                kd.allreduce(x, name="big")
        else:
            kd.allreduce(x, name="big")
    print(f"[rank {r}] every allreduce succeeded with rank 1 frozen", flush=True)
except tf.errors.OpError as e:
    print(f"[rank {r}] collective failed: {' '.join(e.message.split())}", flush=True)
print(f"[rank {r}] leaving the script", flush=True)
