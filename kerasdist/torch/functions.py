"""Horovod's helpers for PyTorch models: broadcasting parameters and an
optimizer's state, and collectives on picklable Python objects."""

import collections

import torch

from kerasdist.common import objects as _objects
from kerasdist.common.process_sets import global_process_set
from kerasdist.torch import mpi_ops as _ops
from kerasdist.torch.handles import synchronize


def _named(params):
    if isinstance(params, (dict, collections.OrderedDict)):
        return sorted(params.items())
    if isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        out = [p if isinstance(p, tuple) else (None, p) for p in params]
        if all(isinstance(p, torch.Tensor) for _, p in out):
            return out
    raise ValueError(
        "Invalid value for argument `params` of `broadcast_parameters`. Expected a "
        "`state_dict()`, `named_parameters()` or a list of tensors. Received: "
        f"{type(params).__name__}")


def broadcast_parameters(params, root_rank, prefix=None, process_set=global_process_set):
    """Overwrites `params` in place with `root_rank`'s values.

    Call it on every rank after building the model (and after loading a
    checkpoint on the root) so that every replica starts alike. All the
    broadcasts are enqueued at once and fused by the engine.

    Args:
        params: `model.state_dict()`, `model.named_parameters()` or a list
            of tensors, in the same order on every rank.
        root_rank: The rank whose values win.
        prefix: Prepended to each name. Defaults to `None`.
        process_set: Defaults to `global_process_set`.

    Example:

    >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # doctest: +SKIP
    """
    handles = []
    for i, (name, p) in enumerate(_named(params)):
        label = f"{prefix or ''}{name if name is not None else i}"
        handles.append(_ops.broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p,
                                             root_rank, name=f"broadcast_parameters.{label}",
                                             process_set=process_set))
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer, root_rank, prefix=None,
                              process_set=global_process_set):
    """Makes `optimizer`'s state (moments, step counts, and each parameter
    group's options such as the learning rate) `root_rank`'s on every rank.

    Unlike Horovod, it needs no dummy step: the root's whole `state_dict()`
    travels as one object, so a root with state (from a checkpoint) and
    ranks without any end up identical.

    Args:
        optimizer: A `torch.optim.Optimizer` (or a `DistributedOptimizer`).
        root_rank: The rank whose state wins.
        prefix: Part of the collective's name. Defaults to `None`.
        process_set: Defaults to `global_process_set`.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("Invalid type for argument `optimizer` of "
                        "`broadcast_optimizer_state`. Expected a torch.optim.Optimizer. "
                        f"Received: {type(optimizer).__name__}")
    state = _objects.broadcast_object(
        optimizer.state_dict(), root_rank=root_rank,
        name=f"broadcast_optimizer_state.{prefix or ''}", process_set=process_set)
    optimizer.load_state_dict(state)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns `root_rank`'s picklable `obj` on every rank (serialized with
    cloudpickle)."""
    return _objects.broadcast_object(obj, root_rank=root_rank, name=name,
                                     process_set=process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns every rank's picklable `obj`, as a list in rank order."""
    return _objects.allgather_object(obj, name=name, process_set=process_set)
