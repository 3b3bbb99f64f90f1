"""Rank-side helper for tests/test_supervise.py: a rank exits before init().

Usage: exit_before_init.py DIR. Rank 0 starts a `sleep` grandchild, writes
DIR/pids ("<own pid> <sleep pid>"), imports TensorFlow and calls
`kerasdist.init()`, which waits for rank 1. Rank 1 waits (bounded) for
DIR/pids, gives rank 0 a moment to enter init(), prints "bad config" to
stderr, writes DIR/exit_time and exits with status 3.
"""

import os
import subprocess
import sys
import time

out = sys.argv[1]
rank = int(os.environ.get("PMI_RANK", "0"))
if rank == 0:
    sleeper = subprocess.Popen(["sleep", "300"])
    import tensorflow  # noqa: F401  (so that init() is what rank 0 waits in)

    import kerasdist as kd

    with open(os.path.join(out, "pids.tmp"), "w") as f:
        f.write(f"{os.getpid()} {sleeper.pid}")
    os.rename(os.path.join(out, "pids.tmp"), os.path.join(out, "pids"))
    kd.init()
    print("rank 0 passed init()", flush=True)
else:
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(out, "pids")):
        if time.monotonic() > deadline:
            sys.exit("rank 0 never got to init()")
        time.sleep(0.05)
    time.sleep(1.0)
    print("bad config", file=sys.stderr, flush=True)
    with open(os.path.join(out, "exit_time"), "w") as f:
        f.write(repr(time.time()))
    sys.exit(3)
