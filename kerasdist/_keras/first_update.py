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

import hashlib
import warnings
import weakref

import numpy as np

from kerasdist._keras import backend as _backend
from kerasdist.common.broadcast_record import was_broadcast
from kerasdist.common.objects import allgather_object
from kerasdist.common.reduce_ops import Max

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
            _backend.broadcast_variables(
                list(opt.__dict__["_kerasdist_sync_vars"]) + list(opt.variables),
                root_rank, name=f"kerasdist.broadcast_global_variables.{n}")
        else:
            opt.__dict__["_kerasdist_sync_root"] = root_rank
            opt.__dict__["_kerasdist_force_sync"] = True


def distributed_optimizer(model):
    """`model`'s distributed optimizer (the one whose `apply` reduces), or None."""
    opt = getattr(model, "optimizer", None)
    for o in (opt, getattr(opt, "inner_optimizer", None)):
        if getattr(o, "_kerasdist_distributed", False):
            return o
    return None


def sync_before_fit(model):
    """The first-update broadcast of `model`'s distributed optimizer, run
    before `fit`'s first step (for backends whose steps run eagerly)."""
    opt = distributed_optimizer(model)
    if opt is None or not model.built:
        return  # a model built by its first batch: the first update does it
    settings = opt.__dict__["_kerasdist_settings"]
    sync_once(opt, list(model.trainable_variables), settings.local_ids, settings.process_set,
              before_step=True)


def sync_once(optimizer, variables, local_ids=(), process_set=None, before_step=False):
    """Broadcasts from rank 0 (the process set's first rank) before
    `optimizer`'s first update, if needed.

    Variables whose ids are in `local_ids` (a partial optimizer's local
    layers) are left alone. On a backend whose steps run eagerly, a call from
    the first `apply` (not `before_step`) comes after the first gradients:
    if the replicas differed, it warns that those gradients came from
    different weights.
    """
    state = optimizer.__dict__
    if state.get("_kerasdist_sync_vars") is not None:
        return
    with _backend.eager_scope():
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
        flag = _backend.allreduce_scalar(np.int32(need), Max,
                                         "kerasdist.first_update.check", process_set)
        if int(flag):
            first = process_set.ranks[0] if process_set is not None else 0
            if not (before_step or _backend.is_tensorflow()):
                _warn_if_replicas_differ(shared, process_set)
            _backend.broadcast_variables(
                everything, root_rank=state.get("_kerasdist_sync_root", first),
                name="kerasdist.first_update", process_set=process_set)


def check_traced(optimizer, variables, local_ids=(), process_set=None):
    """The first update inside a traced step (Keras' jitted JAX step, a
    custom loop's `stateless_apply`), where nothing can be broadcast: once,
    check eagerly that the replicas agree, and warn if they do not. `fit`
    broadcasts before its first step, so this finds nothing to do there."""
    state = optimizer.__dict__
    if state.get("_kerasdist_sync_vars") is not None:
        return
    shared = [v for v in variables if id(v) not in local_ids]
    state["_kerasdist_sync_vars"] = shared
    need = 0 if all(was_broadcast(v) for v in shared) else 1
    # Every rank takes the same path: the digests' allgather is a collective.
    if not int(_backend.allreduce_scalar(np.int32(need), Max,
                                         "kerasdist.first_update.traced", process_set)):
        return
    _warn_if_replicas_differ(
        shared, process_set,
        "The replicas' weights differ at the first update of a DistributedOptimizer "
        "inside a traced (jitted) step, where nothing can be broadcast: the replicas "
        "will train apart. Broadcast before the first step: "
        "`kerasdist.broadcast_variables(model.variables, root_rank=0)` (and the "
        "optimizer's variables once it is built).")


_DIFFERED = (
    "The replicas' weights differed at the first update of a "
    "DistributedOptimizer: rank 0's are broadcast now, but this first "
    "step's gradients were computed from each rank's own weights. In a "
    "custom training loop, broadcast before the first step: "
    "`kerasdist.broadcast_variables(model.variables, root_rank=0)`.")


def _warn_if_replicas_differ(variables, process_set, message=_DIFFERED):
    digest = hashlib.sha256()
    for v in variables:
        digest.update(np.ascontiguousarray(_backend.to_numpy(v)).tobytes())
    digests = allgather_object(digest.hexdigest(), name="kerasdist.first_update.digests",
                               process_set=process_set)
    if len(set(digests)) > 1:
        warnings.warn(message, stacklevel=4)


def _readable(v):
    """Whether `v` holds its value now (eagerly)."""
    return _backend.readable(v)
