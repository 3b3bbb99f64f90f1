"""`python -m kerasdist.runner`: the same as `kerasdist-run`."""

import sys

from kerasdist.runner.cli import main

sys.exit(main())
