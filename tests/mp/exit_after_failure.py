"""A process whose collective failed still exits, within a bound and with a
non-zero code, even though its peer is frozen and MPI_Finalize would wait
for it forever. Rank 1 freezes itself mid-allreduce and is never killed by
the test: the job must end on its own."""

import os
import signal
import threading

import tensorflow as tf

import kerasdist as kd

kd.init()
r = kd.rank()
x = tf.ones([16 << 20])
kd.allreduce(x, name="big")
if r == 1:
    threading.Timer(0.003, os.kill, (os.getpid(), signal.SIGSTOP)).start()
try:
    kd.allreduce(x, name="big")
except tf.errors.OpError as e:
    print(f"[rank {r}] collective failed: {e.message[-160:]}", flush=True)
print(f"[rank {r}] leaving the script", flush=True)
