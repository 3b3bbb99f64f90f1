"""Which variables hold the root's values, as far as kerasdist knows.

The `broadcast_variables` and `broadcast_` functions of every binding record
the variables they set; the first update of a `DistributedOptimizer`
(kerasdist/_keras/first_update.py) reads the record to tell whether rank 0's
state still needs broadcasting.
"""

import weakref

# id(variable) -> variable, for the variables broadcast so far.
_BROADCAST = weakref.WeakValueDictionary()


def mark_broadcast(variables):
    """Records that `variables` hold the root's values now."""
    for v in variables:
        try:
            _BROADCAST[id(v)] = v
        except TypeError:  # not weak-referenceable: never counts as broadcast
            pass


def was_broadcast(v):
    """Whether `v` was recorded by `mark_broadcast` (and is the same object)."""
    return _BROADCAST.get(id(v)) is v
