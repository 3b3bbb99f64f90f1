"""How the Keras layer reduces gradients, for every backend: the settings
of a `DistributedOptimizer` (or tape), the groups and the local variables.
The reductions themselves are per backend (reduce.py for TensorFlow,
reduce_torch.py for PyTorch)."""

import warnings

import numpy as np

from kerasdist.common import process_sets as _sets
from kerasdist.common.reduce_ops import Adasum, Average, Sum


class Settings:
    """How gradients are reduced; kept off Keras' attribute tracking.

    `op`, `prescale` and `postscale` are what the engine runs (a predivided
    average is a `Sum` with both factors set). `groups` is an int (split the
    gradients into that many fused groups) or a list of lists of variables
    (each list one fused group), or `None`. `local_ids` are the ids of
    variables whose gradients stay local; with `scale_local` they are
    divided by the number of ranks. `process_set` is the set reduced over
    (`None`: every rank).
    """

    __slots__ = ("op", "prescale", "postscale", "compression", "sparse_as_dense",
                 "groups", "local_ids", "scale_local", "process_set")

    def __init__(self, op, prescale, postscale, compression, sparse_as_dense,
                 groups=None, local_ids=None, scale_local=True, process_set=None):
        self.op = op
        self.prescale = prescale
        self.postscale = postscale
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.groups = groups
        self.local_ids = set(local_ids or ())
        self.scale_local = scale_local
        self.process_set = process_set

    def size(self):
        """The number of ranks the gradients are reduced over."""
        set_id, _ = _sets.resolve(self.process_set, "DistributedOptimizer")
        return _sets.rank_size(set_id)[1]


def resolve_groups(num_groups, groups):
    """Checks Horovod's `num_groups` / `groups` pair; returns one value."""
    if num_groups:
        if not isinstance(num_groups, int) or num_groups < 0:
            raise ValueError(
                "Invalid value for argument `num_groups`. Expected a "
                f"non-negative integer. Received: num_groups={num_groups!r}")
        if groups is not None:
            raise ValueError(
                "Give `groups` or the deprecated `num_groups`, not both. "
                f"Received: num_groups={num_groups!r}, groups={groups!r}")
        warnings.warn("`num_groups` is deprecated, as in Horovod; use "
                      "`groups=<int>` instead.", DeprecationWarning, stacklevel=3)
        return num_groups
    if groups is None or groups == 0:
        return None
    if isinstance(groups, int) and not isinstance(groups, bool) and groups > 0:
        return groups
    if isinstance(groups, (list, tuple)) and all(
            isinstance(g, (list, tuple)) for g in groups):
        return [list(g) for g in groups]
    raise ValueError(
        "Invalid value for argument `groups`. Expected a non-negative integer "
        f"or a list of lists of variables. Received: groups={groups!r}")


def make_settings(op, gradient_predivide_factor, compression, sparse_as_dense,
                  postscale=1.0, groups=None, process_set=None):
    """Engine op and factors for Horovod's (op, gradient_predivide_factor)."""
    if op not in (Average, Sum, Adasum):
        raise ValueError(
            "Invalid value for argument `op`. Expected kerasdist.Average, "
            f"kerasdist.Sum or kerasdist.Adasum. Received: op={op!r}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError(
            "`gradient_predivide_factor` requires op=kerasdist.Average. "
            f"Received: op={op!r}")
    prescale, reduce_op = 1.0, op
    if gradient_predivide_factor != 1.0:
        reduce_op = Sum
        prescale = 1.0 / gradient_predivide_factor
        size = _sets.rank_size(_sets.resolve(process_set, "DistributedOptimizer")[0])[1]
        postscale *= gradient_predivide_factor / size
    return Settings(reduce_op, prescale, postscale, compression, sparse_as_dense,
                    groups=groups, process_set=process_set)


def variable_ids(layers_or_variables):
    """The ids of the trainable variables of layers (or of variables)."""
    if layers_or_variables is None:
        return set()
    if not isinstance(layers_or_variables, (list, tuple)):
        layers_or_variables = [layers_or_variables]
    ids = set()
    for item in layers_or_variables:
        weights = getattr(item, "trainable_weights", None)
        if weights is None:
            ids.add(id(item))
        else:
            ids.update(id(w) for w in weights)
    return ids


def group_plan(indices, variables, groups):
    """Lists of gradient indices, each reduced in one grouped op."""
    if groups is None or (variables is None and not isinstance(groups, int)):
        return [[i] for i in indices]
    if isinstance(groups, int):
        return [list(part) for part in np.array_split(indices, min(groups, len(indices)))
                if len(part)]
    position = {id(variables[i]): i for i in indices}
    plan, used = [], set()
    for group in groups:
        members = [position[id(v)] for v in group
                   if id(v) in position and position[id(v)] not in used]
        used.update(members)
        if members:
            plan.append(sorted(members))
    plan += [[i] for i in indices if i not in used]
    return plan


def split_local(grads, variables, settings, size, scale_local):
    """Sorts gradients into those to reduce and the local ones.

    Returns `(out, shared)`: `out` is a copy of `grads` in which each local
    gradient (of a variable in `settings.local_ids`) is already final,
    divided by `size` with `scale_local(grad, size)` when
    `settings.scale_local`; `shared` lists the indices still to reduce.
    `None` gradients stay `None`.
    """
    out, shared = list(grads), []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if variables is not None and id(variables[i]) in settings.local_ids:
            if settings.scale_local:
                out[i] = scale_local(g, size)
            continue
        shared.append(i)
    return out, shared


def gradient_name(variables, indices):
    """The engine name of the group of gradients `indices`: from the first
    variable's path, so that it is the same on every rank and every step
    (and the engine's cache hits); `None` (numbered per call) without."""
    if variables is None:
        return None
    path = getattr(variables[indices[0]], "path", None)
    return f"keras.grads.{path}.{len(indices)}" if path else None


def binding_compressor(compression, binding_compression):
    """The binding's compressor (`binding_compression`, its `Compression`)
    for Horovod's standard ones, those of `kerasdist.Compression` or of any
    binding; any other is used as given."""
    if getattr(compression, "__module__", "").startswith("kerasdist."):
        kinds = {"NoneCompressor": binding_compression.none,
                 "FP16Compressor": binding_compression.fp16,
                 "BF16Compressor": binding_compression.bf16}
        return kinds.get(compression.__name__, compression)
    return compression


def grouped_plan(grads, variables, settings):
    """For a backend that reduces its gradients in groups (torch, JAX):
    `(out, plan)`, where `out` is `grads` with the local gradients final
    (divided by the size) and `plan` lists the groups of indices to reduce
    (one group of all of them unless `settings.groups` splits them; none on
    one rank)."""
    grads = list(grads)
    size = settings.size()
    if size == 1:
        return grads, []
    out, shared = split_local(grads, variables, settings, size, lambda g, n: g / n)
    if not shared:
        return out, []
    if settings.groups is None:
        return out, [shared]
    return out, group_plan(shared, variables, settings.groups)
