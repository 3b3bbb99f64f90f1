"""A loop of allreduces that a test interrupts by taking a host away.

Args (argv): `<fault dir> [MiB]`. Every rank runs allreduces of a float32
buffer (default 4 MiB) in a loop, checking each result. After a few
iterations rank 0 writes `<fault dir>/ready`; the test then kills the ranks
of one host, or cuts its link, from inside that host. The loop runs until
a collective fails (at most 300 s). A rank whose collective failed prints

    FAULT rank=<r> host=<hostname> at=<time.time()> error=<message>

(one line, newlines in the message replaced) and exits 1; a rank whose loop
ran out prints `FAULT rank=<r> no error` and exits 2.
"""

import os
import socket
import sys
import time

import numpy as np
import tensorflow as tf

import kerasdist as kd

LIMIT_S = 300.0


def report(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    fault_dir = sys.argv[1]
    n = int(sys.argv[2] if len(sys.argv) > 2 else 4) * (1 << 20) // 4
    kd.init()
    r, size = kd.rank(), kd.size()
    host = socket.gethostname()
    x = tf.fill([n], float(r + 1))
    want = size * (size + 1) / 2
    start, i = time.monotonic(), 0
    try:
        while time.monotonic() - start < LIMIT_S:
            y = kd.allreduce(x, op=kd.Sum, name="fault.loop")
            head = y[:4].numpy()
            if not np.array_equal(head, np.full(4, want, np.float32)):
                raise AssertionError(f"wrong sum {head} (want {want})")
            i += 1
            if i == 5 and r == 0:
                with open(os.path.join(fault_dir, "ready.tmp"), "w") as f:
                    f.write(f"{time.time()}\n")
                os.replace(os.path.join(fault_dir, "ready.tmp"),
                           os.path.join(fault_dir, "ready"))
    except tf.errors.OpError as e:
        message = " | ".join(e.message.splitlines())
        report(f"FAULT rank={r} host={host} at={time.time():.3f} iters={i} "
               f"error={message}")
        sys.exit(1)
    report(f"FAULT rank={r} no error after {i} iterations")
    sys.exit(2)


main()
