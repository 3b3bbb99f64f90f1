"""Test-only: makes the frameworks fail to import in every Python process
started with this directory on PYTHONPATH (the launcher, its supervisors
and the ranks), as on a machine where none is installed.

`KERASDIST_TEST_ALLOW=torch` (a comma-separated list) lets those through:
a binding's tests run with every other framework blocked.
"""

import importlib.abc
import importlib.machinery
import os
import sys

_ALLOWED = set(filter(None, os.environ.get("KERASDIST_TEST_ALLOW", "").split(",")))
BLOCKED = tuple(f for f in ("tensorflow", "keras", "torch", "jax", "jaxlib", "tf_keras")
                if f not in _ALLOWED)


class _Missing(importlib.abc.Loader):
    """Importing a blocked module fails as for one not installed."""

    def create_module(self, spec):
        raise ModuleNotFoundError(f"{spec.name} cannot be imported in this test",
                                  name=spec.name)

    def exec_module(self, module):  # never reached
        raise ModuleNotFoundError(module.__name__)


class _Block(importlib.abc.MetaPathFinder):
    # A spec without an origin: `importlib.util.find_spec` probes (as
    # torch._dynamo makes for optional modules) see nothing to load from,
    # and an import raises ModuleNotFoundError.
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            return importlib.machinery.ModuleSpec(fullname, _Missing(), origin=None)
        return None


sys.meta_path.insert(0, _Block())
