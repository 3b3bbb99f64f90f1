"""Test-only: makes the frameworks fail to import in every Python process
started with this directory on PYTHONPATH (the launcher, its supervisors
and the ranks), as on a machine where none is installed."""

import importlib.abc
import sys

BLOCKED = ("tensorflow", "keras", "torch", "jax", "jaxlib", "tf_keras")


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ImportError(f"{fullname} cannot be imported in this test")
        return None


sys.meta_path.insert(0, _Block())
