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

from kerasdist.tensorflow import ops
from kerasdist.tensorflow.broadcast_record import was_broadcast
from kerasdist.tensorflow.functions import allgather_object, broadcast_variables

# Every DistributedOptimizer as (creation number, weak reference); the
# numbers agree across ranks that create their optimizers in the same order.
_OPTIMIZERS = []
_CREATED = [0]


def register(optimizer):
    """Records a new distributed optimizer (for `broadcast_global_variables`)."""
    if any(ref() is optimizer for _, ref in _OPTIMIZERS):
        return
    _OPTIMIZERS[:] = [(n, ref) for n, ref in _OPTIMIZERS if ref() is not None]
    _OPTIMIZERS.append((_CREATED[0], weakref.ref(optimizer)))
    _CREATED[0] += 1


def broadcast_global_variables(root_rank):
    """Broadcasts the state of every distributed optimizer's model from
    `root_rank`: now for those that have updated (their trainable variables
    are known), at their first update for the others.

    Optimizers are garbage-collected at different times on different ranks,
    so the ranks first agree on the optimizers alive everywhere (by creation
    number) and whether each has updated.
    """
    alive = {}
    for n, ref in _OPTIMIZERS:
        opt = ref()
        if opt is not None:
            alive[n] = opt
    mine = {n: opt.__dict__.get("_kerasdist_sync_vars") is not None
            for n, opt in alive.items()}
    everyone = allgather_object(mine, name="kerasdist.broadcast_global_variables")
    common = sorted(set.intersection(*(set(m) for m in everyone)))
    for n in common:
        known = {m[n] for m in everyone}
        if len(known) > 1:
            raise RuntimeError(
                "broadcast_global_variables: the ranks disagree whether "
                f"DistributedOptimizer #{n} has made its first update; every "
                "rank must run the same training steps.")
        opt = alive[n]
        if known.pop():
            broadcast_variables(
                list(opt.__dict__["_kerasdist_sync_vars"]) + list(opt.variables),
                root_rank, name=f"kerasdist.broadcast_global_variables.{n}")
        else:
            opt.__dict__["_kerasdist_sync_root"] = root_rank
            opt.__dict__["_kerasdist_force_sync"] = True


def sync_once(optimizer, variables, local_ids=(), process_set=None):
    """Broadcasts from rank 0 (the process set's first rank) before
    `optimizer`'s first update, if needed.

    Variables whose ids are in `local_ids` (a partial optimizer's local
    layers) are left alone.
    """
    state = optimizer.__dict__
    if state.get("_kerasdist_sync_vars") is not None:
        return
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
        need = 0 if all(was_broadcast(v) for v in everything) else 1
        if state.pop("_kerasdist_force_sync", False):
            need = 1
        flag = ops.allreduce(tf.constant(need, tf.int32), op=ops.Max,
                             name="kerasdist.first_update.check", process_set=process_set)
        if int(flag):
            first = process_set.ranks[0] if process_set is not None else 0
            broadcast_variables(everything,
                                root_rank=state.get("_kerasdist_sync_root", first),
                                name="kerasdist.first_update", process_set=process_set)


def _readable(v):
    """Whether `v` holds its value now (eagerly)."""
    try:
        return tuple(tf.convert_to_tensor(v).shape) == tuple(v.shape)
    except Exception:  # not initialized yet
        return False
