"""Test-only: makes the frameworks fail to import in every Python process
started with this directory on PYTHONPATH (the launcher, its supervisors
and the ranks), as on a machine where none is installed.

`KERASDIST_TEST_ALLOW=torch` (a comma-separated list) lets those through:
a binding's tests run with every other framework blocked.
"""

import importlib.abc
import os
import sys

_ALLOWED = set(filter(None, os.environ.get("KERASDIST_TEST_ALLOW", "").split(",")))
BLOCKED = tuple(f for f in ("tensorflow", "keras", "torch", "jax", "jaxlib", "tf_keras")
                if f not in _ALLOWED)


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ImportError(f"{fullname} cannot be imported in this test")
        return None


sys.meta_path.insert(0, _Block())
