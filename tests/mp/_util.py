"""Helpers for the multi-process test scripts (run under mpiexec)."""

import os
import signal
import sys
import threading
import time
import traceback

import kerasdist as kd


def log(*args):
    # One write per line, so that lines from different ranks do not mix.
    line = " ".join([f"[rank {kd.rank()}]"] + [str(a) for a in args]) + "\n"
    sys.stdout.write(line)
    sys.stdout.flush()


def main(fn):
    """Runs fn(); prints a rank-prefixed traceback and exits 1 on failure."""
    try:
        kd.init()
        fn()
        log("OK")
    except BaseException:
        rank = kd.rank() if kd.is_initialized() else "?"
        sys.stdout.write(f"[rank {rank}] FAILED\n{traceback.format_exc()}")
        sys.stdout.flush()
        sys.exit(1)


class StopInside:
    """Stops this process (SIGSTOP) inside one of the calls of a loop.

    Wrap each collective of the loop in `with stop:`. A watcher thread
    stops the process `fraction` of the shortest call so far into a call,
    and only while that call is still running, so the stop never lands
    between two collectives, however the load stretches or shrinks them.
    `shortest`: the duration of a warm-up call.
    """

    def __init__(self, shortest, fraction=0.25):
        self.shortest, self.fraction = shortest, fraction
        self.started = None  # monotonic start of the call in progress
        threading.Thread(target=self._watch, daemon=True).start()

    def __enter__(self):
        self.started = time.monotonic()

    def __exit__(self, *exc):
        self.shortest = min(self.shortest, time.monotonic() - self.started)
        self.started = None

    def _watch(self):
        while True:
            started = self.started
            if (started is not None and self.started == started
                    and time.monotonic() - started >= self.fraction * self.shortest):
                os.kill(os.getpid(), signal.SIGSTOP)
                return
            time.sleep(0.002)
