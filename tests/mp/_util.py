"""Helpers for the multi-process test scripts (run under mpiexec)."""

import sys
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
