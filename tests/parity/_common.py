"""Shared by the parity rank scripts: the helpers of tests/mp."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mp"))

from _util import log, main  # noqa: E402,F401
