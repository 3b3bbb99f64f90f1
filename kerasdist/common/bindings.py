"""The framework bindings, as the framework-neutral runtime sees them.

kerasdist.common imports no framework. What it needs from one, a binding
registers here when it is imported (kerasdist/tensorflow/__init__.py
registers the TensorFlow binding); the runtime then

- calls the binding's `after_init(context)` at the end of every `init()`,
  and at once when the binding is registered after `init()` (the
  TensorFlow binding sizes TensorFlow's thread pools there);
- adds the binding's entries to `build_info()`.
"""

from kerasdist.common.context import context


class Binding:
    """A framework binding's entry points for the runtime.

    Args:
        name: The framework, e.g. `"tensorflow"`. Registering a binding
            of the same name again replaces it.
        after_init: `fn(context)`, called once the engine runs. Defaults to
            `None`.
        build_info: `fn()` returning a dict of entries for `build_info()`.
            Defaults to `None`.
    """

    def __init__(self, name, after_init=None, build_info=None):
        self.name = name
        self.after_init = after_init
        self.build_info = build_info

    def __repr__(self):
        return f"Binding({self.name!r})"


_BINDINGS = []  # in the order of registration


def register(binding):
    """Registers `binding`; calls its `after_init` now if `init()` has run."""
    if not isinstance(binding, Binding):
        raise TypeError("Invalid type for argument `binding`. Expected a "
                        f"kerasdist.common.bindings.Binding. Received: {binding!r}")
    _BINDINGS[:] = [b for b in _BINDINGS if b.name != binding.name] + [binding]
    if context.initialized and binding.after_init is not None:
        binding.after_init(context)


def registered():
    """The registered bindings, in the order of registration."""
    return list(_BINDINGS)


def after_init(ctx):
    """Runs every binding's `after_init(ctx)`; `init()` calls it."""
    for binding in _BINDINGS:
        if binding.after_init is not None:
            binding.after_init(ctx)
