"""Runs every docstring example of kerasdist (and kerasdist.callbacks) with
doctest, at one process, after `kerasdist.init()`. An example that needs
more than that (a model, data, several ranks) is marked
`# doctest: +SKIP`. Prints one line per docstring and exits 1 if one fails.
Run by tests/test_docs.py."""

import doctest
import importlib
import os
import sys

import jax
import jax.numpy as jnp
import keras
import numpy as np
import tensorflow as tf
import torch

import kerasdist
import kerasdist.callbacks  # noqa: F401
import kerasdist.data  # noqa: F401
import kerasdist.jax
import kerasdist.torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules():
    """The modules whose source holds a `>>>` example."""
    found = []
    for folder, package in (("kerasdist", "kerasdist"), ("callbacks", "kerasdist.callbacks")):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                if not name.endswith(".py") or ">>>" not in open(path).read():
                    continue
                rel = os.path.relpath(path, os.path.join(ROOT, folder))[:-3].replace("/", ".")
                rel = rel.removesuffix("__init__").rstrip(".")
                found.append(package + ("." + rel if rel else ""))
    return sorted(found)


def main():
    kerasdist.init()
    failed = 0
    for name in modules():
        module = importlib.import_module(name)
        hvd = kerasdist.torch if name.startswith("kerasdist.torch") else kerasdist
        globs = {"kerasdist": kerasdist, "kd": kerasdist, "hvd": hvd, "tf": tf,
                 "keras": keras, "np": np, "torch": torch, "jax": jax, "jnp": jnp}
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        for test in doctest.DocTestFinder().find(module, name, globs=globs):
            if not test.examples:
                continue
            result = runner.run(test, out=sys.stdout.write)
            failed += bool(result.failed)
            print(("FAILED " if result.failed else "ran ") + test.name, flush=True)
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
