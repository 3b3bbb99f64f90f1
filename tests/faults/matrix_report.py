"""Runs the fault matrix of tests/test_faults.py by hand and writes the table.

    python tests/faults/matrix_report.py [--workers N] [--only SUBSTRING ...]

Prints each case as it is set up, then writes the markdown table (case x
np -> fault-to-last-survivor-exit, launcher exit, leftovers, /dev/shm,
message excerpt) to tests/faults/last_matrix.md and prints it. Running
`python -m pytest tests/test_faults.py` writes the same file.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402
import test_faults  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--only", nargs="*", default=[],
                   help="Run only the cases whose id contains one of these.")
    p.add_argument("--out", default=os.path.join(HERE, "last_matrix.md"))
    args = p.parse_args(argv)
    cases = [c for c in test_faults.CASES
             if not args.only or any(s in c.id for s in args.only)]
    for c in cases:
        print("case", c.id, flush=True)
    start = time.monotonic()
    results = harness.run_cases(cases, workers=args.workers,
                                hang_bound=test_faults.BOUND_S + 2)
    text = harness.table(results.values())
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    print(f"{len(cases)} cases in {time.monotonic() - start:.0f} s; "
          f"table written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
