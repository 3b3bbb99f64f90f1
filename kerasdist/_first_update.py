"""The first update of a `DistributedOptimizer` starts every rank from rank
0's state when nothing has broadcast it yet.

A script that forgets `BroadcastGlobalVariablesCallback` (or
`broadcast_variables`) would otherwise average gradients into replicas that
started from different random weights and never become equal. So, once per
optimizer, before its first update, the ranks agree (one tiny allreduce)
whether every trainable variable and optimizer variable was broadcast
already; if some rank's were not, rank 0's trainable and optimizer variables
are broadcast. Inside a compiled step this runs eagerly while the step is
traced, that is before the step first executes. (Keras first traces the
step of a model built by its first call symbolically, before its variables
hold values; that pass is skipped.)

Not covered: non-trainable model variables (BatchNormalization's moving
statistics), which the optimizer never sees; the callback broadcasts those.
"""

import weakref

import tensorflow as tf

from kerasdist import ops

# id(variable) -> variable, for the variables broadcast so far.
_BROADCAST = weakref.WeakValueDictionary()
# Every DistributedOptimizer, in creation order (the same on every rank).
_OPTIMIZERS = []


def register(optimizer):
    """Records a new distributed optimizer (for `broadcast_global_variables`)."""
    if not any(ref() is optimizer for ref in _OPTIMIZERS):
        _OPTIMIZERS[:] = [ref for ref in _OPTIMIZERS if ref() is not None]
        _OPTIMIZERS.append(weakref.ref(optimizer))


def broadcast_global_variables(root_rank):
    """Broadcasts the state of every distributed optimizer's model from
    `root_rank`: now for those that have updated (their trainable variables
    are known), at their first update for the others."""
    from kerasdist.functions import broadcast_variables

    for i, ref in enumerate(list(_OPTIMIZERS)):
        opt = ref()
        if opt is None:
            continue
        known = opt.__dict__.get("_kerasdist_sync_vars")
        if known is None:
            opt.__dict__["_kerasdist_sync_root"] = root_rank
            opt.__dict__["_kerasdist_force_sync"] = True
        else:
            broadcast_variables(list(known) + list(opt.variables), root_rank,
                                name=f"kerasdist.broadcast_global_variables.{i}")


def mark_broadcast(variables):
    """Records that `variables` hold the root's values now."""
    for v in variables:
        try:
            _BROADCAST[id(v)] = v
        except TypeError:  # not weak-referenceable: never counts as broadcast
            pass


def _was_broadcast(v):
    return _BROADCAST.get(id(v)) is v


def sync_once(optimizer, variables, local_ids=()):
    """Broadcasts from rank 0 before `optimizer`'s first update, if needed.

    Variables whose ids are in `local_ids` (a partial optimizer's local
    layers) are left alone.
    """
    state = optimizer.__dict__
    if state.get("_kerasdist_sync_vars") is not None:
        return
    from kerasdist.functions import broadcast_variables

    with tf.init_scope():
        if not all(_readable(v) for v in variables):
            # Keras' symbolic build of a model built by its first call
            # traces the step before the variables hold values; the same
            # check passes on every rank, and the real step comes next.
            return
        shared = [v for v in variables if id(v) not in local_ids]
        state["_kerasdist_sync_vars"] = shared
        if not optimizer.built:
            optimizer.build(variables)
        everything = shared + list(optimizer.variables)
        need = 0 if all(_was_broadcast(v) for v in everything) else 1
        if state.pop("_kerasdist_force_sync", False):
            need = 1
        flag = ops.allreduce(tf.constant(need, tf.int32), op=ops.Max,
                             name="kerasdist.first_update.check")
        if int(flag):
            broadcast_variables(everything,
                                root_rank=state.get("_kerasdist_sync_root", 0),
                                name="kerasdist.first_update")


def _readable(v):
    """Whether `v` holds its value now (eagerly)."""
    try:
        return tuple(tf.convert_to_tensor(v).shape) == tuple(v.shape)
    except Exception:  # not initialized yet
        return False
