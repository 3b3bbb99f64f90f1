"""kerasdist's TensorFlow binding: the collectives as TensorFlow ops, their
gradients, and the collectives on variables and Python objects built on
them.

Importing it registers the binding with the framework-neutral runtime
(kerasdist/common/bindings.py): `init()` then sizes TensorFlow's thread
pools (at once if `init()` has run already), process sets agree on their
calls through this binding's `allgather_object`, and `build_info()` lists
its ops. It imports the modules that register gradients (ops, collectives),
so the gradients exist whenever the binding is loaded.

`init` and `build_info` are kerasdist.common.basics' own, exported here so
that `kerasdist.init` and `kerasdist.build_info` load the binding first.
"""

from kerasdist.common import bindings
from kerasdist.common.basics import build_info, init  # noqa: F401  (see above)
from kerasdist.tensorflow import collectives, functions, library, ops, queries  # noqa: F401

bindings.register(bindings.Binding(
    "tensorflow",
    after_init=library.after_init,
    build_info=library.build_info,
))
