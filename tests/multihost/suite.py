"""Runs several rank scripts one after another in one process per rank.

Usage: `suite.py SCRIPT [SCRIPT ...]`, each a path relative to `tests/`
(e.g. `mp/allreduce_sweep.py`), optionally with arguments after a colon:
`multihost/big_allreduce.py:1,16`. Starting TensorFlow once per rank rather
than once per script keeps the multihost tests within their time budget.
Each script runs as `__main__`; the first one that fails (exits non-zero or
raises) ends the job with its status. Prints `SUITE <script> done` after
each script on each rank.
"""

import os
import runpy
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TESTS, "mp"))


def run_one(spec):
    path, _, args = spec.partition(":")
    full = os.path.join(TESTS, path)
    sys.argv = [full] + (args.split(",") if args else [])
    try:
        runpy.run_path(full, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            sys.stdout.write(f"SUITE {path} failed with exit status {e.code}\n")
            sys.stdout.flush()
            raise
    import kerasdist as kd

    sys.stdout.write(f"[rank {kd.rank()}] SUITE {path} done\n")
    sys.stdout.flush()


def main():
    for spec in sys.argv[1:]:
        run_one(spec)


main()
