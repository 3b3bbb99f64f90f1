"""Horovod's `DistributedOptimizer` for PyTorch, on kerasdist's engine.

Each parameter's gradient is allreduced from a hook as soon as autograd has
accumulated it (`Tensor.register_post_accumulate_grad_hook`), so the
communication overlaps the rest of the backward pass; `step()` (or
`synchronize()`) waits for them and then updates. A parameter that got no
gradient on this rank still takes part, with zeros, so the ranks never
diverge nor wait on each other.
"""

import contextlib
import os
import warnings

import torch

from kerasdist.common import process_sets as _sets
from kerasdist.common.context import context
from kerasdist.common.process_sets import global_process_set
from kerasdist.torch import mpi_ops as _ops
from kerasdist.torch.compression import Compression
from kerasdist.torch.handles import discard as _discard
from kerasdist.torch.handles import synchronize as _wait


def _split(items, n):
    """`items` in `n` contiguous groups of near-equal length."""
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(tuple(items[start:end]))
        start = end
    return out


_DEFAULT_BUCKET_BYTES = 4 << 20


def _bucket_bytes():
    raw = os.environ.get("KERASDIST_TORCH_BUCKET_BYTES", "").strip()
    if not raw:
        return _DEFAULT_BUCKET_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError("Invalid value for environment variable KERASDIST_TORCH_BUCKET_BYTES. "
                         f"Expected an integer >= 0. Received: {raw!r}")
    return value


def _buckets(params, cap):
    """Consecutive parameters, last first (about the order in which the
    backward pass finishes their gradients), in buckets of up to `cap`
    bytes; each bucket is reduced as one grouped allreduce once all its
    gradients are ready. The same on every rank that builds the same model.
    `cap` 0: one allreduce per parameter."""
    if cap <= 0:
        return [(p,) for p in params]
    units, current, size = [], [], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > cap:
            units.append(tuple(current))
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        units.append(tuple(current))
    return units


class _Flat:
    """The compression context of a unit reduced as one flat buffer."""

    __slots__ = ("ctx",)

    def __init__(self, ctx):
        self.ctx = ctx


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods a wrapped optimizer's class gains (see
    `DistributedOptimizer`); `super(self.__class__, self)` is the user's
    optimizer class."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=_ops.Average, gradient_predivide_factor=1.0, groups=None,
                 sparse_as_dense=False, process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(item, tuple) for item in named):
                raise ValueError(
                    "Invalid value for argument `named_parameters` of "
                    "`DistributedOptimizer`. Expected (name, parameter) tuples, as from "
                    "`model.named_parameters()`.")
            names = [n for n, _ in named]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError("Parameter names in `named_parameters` must be unique. "
                                 f"Found duplicates: {', '.join(dups)}")
            unnamed = {id(p) for p in all_params} - {id(p) for _, p in named}
            if unnamed:
                raise ValueError(
                    "`named_parameters` was given, but one or more of the optimizer's "
                    f"parameters are not in it (Python object ids: {sorted(unnamed)}).")
        else:
            named = [(f"allreduce.noname.{i}.{j}", p)
                     for i, g in enumerate(self.param_groups) for j, p in enumerate(g["params"])]
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError("Invalid value for argument `backward_passes_per_step`. Expected "
                             f"an integer >= 1. Received: {backward_passes_per_step!r}")
        if op == _ops.Adasum and gradient_predivide_factor != 1.0:
            raise ValueError("`gradient_predivide_factor` is not supported with op=Adasum.")
        self._parameter_names = {p: f"allreduce.{n}" if named_parameters is not None else n
                                 for n, p in named}
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._set_id = _sets.resolve(process_set, "DistributedOptimizer")[0] \
            if process_set is not None and process_set.included() else None
        self._handles = {}  # unit (tuple of params) -> (handle, compression contexts)
        self._flat = {}  # unit -> its flat gradient buffer (_start_flat)
        self._delay = {p: backward_passes_per_step for p in all_params}
        self._ready = {}  # unit -> params whose gradients are final
        self._synchronized = False
        self._should_synchronize = True
        self._hooks = []
        trainable = [p for p in all_params if p.requires_grad]
        self._units = self._make_units(trainable, groups)
        self._unit_of = {p: unit for unit in self._units for p in unit}
        if self._set_id is not None and (context.size > 1):
            for p in trainable:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    @staticmethod
    def _make_units(params, groups):
        if groups is None:
            return _buckets(params, _bucket_bytes())
        if isinstance(groups, int) and not isinstance(groups, bool):
            if groups < 1:
                raise ValueError("`groups` (or `num_groups`) must be a positive integer or a "
                                 f"list of lists of parameters. Received: {groups!r}")
            return _split(params, groups)
        if not isinstance(groups, list):
            raise ValueError("`groups` must be a positive integer or a list of lists of "
                             f"parameters. Received: {type(groups).__name__}")
        seen, units = set(), []
        trainable = {id(p) for p in params}
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("`groups` must consist of torch.Tensor parameters.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in `groups`.")
                seen.add(id(p))
            unit = tuple(p for p in group if id(p) in trainable)
            if unit:
                units.append(unit)
        units += [(p,) for p in params if id(p) not in seen]
        return units

    def _scales(self):
        if self.op == _ops.Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _start(self, unit):
        """Enqueues the allreduce of `unit`'s gradients; zeros for a
        parameter that got none, so that every rank takes part."""
        for p in unit:
            if p.grad is None:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        name = self._parameter_names[unit[0]]
        pre, post = self._scales()
        if len(unit) == 1:
            p = unit[0]
            tensor = p.grad
            if tensor.is_sparse:
                if not self.sparse_as_dense:
                    handle = _ops.sparse_allreduce_async(
                        tensor, name=name, op=self.op, process_set=self.process_set)
                    return handle, (None,)
                tensor = tensor.to_dense()
            wire, ctx = self._compression.compress(tensor)
            handle = _ops.allreduce_async_(wire, name=name, op=self.op, prescale_factor=pre,
                                           postscale_factor=post, process_set=self.process_set)
            return handle, (ctx,)
        dense = [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in unit]
        if (self.op != _ops.Adasum and len({t.dtype for t in dense}) == 1
                and not any(p.grad.is_sparse for p in unit)):
            return self._start_flat(unit, dense, name, pre, post)
        pairs = [self._compression.compress(t) for t in dense]
        handle = _ops.grouped_allreduce_async_(
            [w for w, _ in pairs], name=f"{name}.group", op=self.op, prescale_factor=pre,
            postscale_factor=post, process_set=self.process_set)
        return handle, tuple(c for _, c in pairs)

    def _start_flat(self, unit, dense, name, pre, post):
        """One allreduce of the unit's gradients copied into one flat
        buffer (kept per unit): one request instead of one per tensor, the
        way DDP's buckets go. Elementwise reductions give the same values.
        (Adasum is per tensor, so its units stay grouped.)"""
        total = sum(t.numel() for t in dense)
        flat = self._flat.get(unit)
        if flat is None or flat.numel() != total or flat.dtype != dense[0].dtype:
            flat = self._flat[unit] = torch.empty(total, dtype=dense[0].dtype)
        torch.cat([t.reshape(-1) for t in dense], out=flat)
        wire, ctx = self._compression.compress(flat)
        handle = _ops.allreduce_async_(wire, name=f"{name}.bucket", op=self.op,
                                       prescale_factor=pre, postscale_factor=post,
                                       process_set=self.process_set)
        return handle, _Flat(ctx)

    def _make_hook(self, p):
        def hook(param):
            del param
            if self._delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times "
                    "before the call to step(). Increase backward_passes_per_step to "
                    "accumulate gradients locally.")
            self._delay[p] -= 1
            if self._delay[p] > 0:
                return
            unit = self._unit_of[p]
            ready = self._ready.setdefault(unit, set())
            ready.add(p)
            if len(ready) == len(unit) and unit not in self._handles:
                self._handles[unit] = self._start(unit)
        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce (starting those not started:
        parameters without a gradient this step, or fewer backward passes
        than `backward_passes_per_step`) and writes the results into the
        parameters' `.grad`.

        Raises:
            HorovodInternalError: If a collective failed; the optimizer is
                left ready for the next step.
        """
        if self._set_id is None:
            self._synchronized = True
            return
        try:
            if context.size > 1:
                for unit in self._units:
                    if unit not in self._handles:
                        self._handles[unit] = self._start(unit)
            for unit, (handle, ctxs) in self._handles.items():
                output = handle() if callable(handle) else _wait(handle)
                if isinstance(ctxs, _Flat):
                    flat, offset = self._compression.decompress(output, ctxs.ctx), 0
                    for p in unit:
                        n = p.grad.numel()
                        p.grad.copy_(flat[offset:offset + n].view(p.grad.shape))
                        offset += n
                    continue
                outputs = output if len(unit) > 1 else [output]
                for p, out, ctx in zip(unit, outputs, ctxs):
                    self._write(p, self._compression.decompress(out, ctx))
        finally:
            self._reset()
        self._synchronized = True

    @staticmethod
    def _write(p, result):
        if p.grad.is_sparse or result.is_sparse or result.dtype != p.grad.dtype:
            p.grad = result.to_sparse() if p.grad.is_sparse and not result.is_sparse \
                else result.to(p.grad.dtype)
        elif result.data_ptr() != p.grad.data_ptr():
            p.grad.copy_(result)

    def _reset(self):
        for handle, _ in self._handles.values():
            if not callable(handle):
                _discard(handle)
        self._handles.clear()
        self._ready.clear()
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step

    def set_backward_passes_per_step(self, passes):
        """Sets `backward_passes_per_step` (and restarts the count)."""
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within it, `step()` does not synchronize: use it after calling
        `synchronize()` yourself (e.g. to clip the reduced gradients).

        Example:

        >>> optimizer.synchronize()  # doctest: +SKIP
        >>> torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # doctest: +SKIP
        >>> with optimizer.skip_synchronize():  # doctest: +SKIP
        ...     optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context "
                    "after optimizer.synchronize(), so the gradients are reduced twice. Use "
                    "`with optimizer.skip_synchronize(): optimizer.step()`.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles or any(self._ready.values()):
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited: the "
                "gradients' allreduces are still running.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        self._reset()
        self._synchronized = False
        self._should_synchronize = True
        return super(self.__class__, self).load_state_dict(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=_ops.Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set):
    """Wraps a `torch.optim.Optimizer` so that `step()` applies gradients
    averaged (or reduced with `op`) over the ranks, as Horovod's does.

    Args:
        optimizer: The optimizer; the wrapper takes over its parameter
            groups (and their options), not its state.
        named_parameters: `model.named_parameters()`, naming each
            gradient's allreduce. Defaults to `None` (names from the order
            of the parameters, equal on ranks that build the same model).
        compression: `Compression.none`, `fp16` or `bf16`. Defaults to
            `Compression.none`.
        backward_passes_per_step: Backward passes accumulated locally
            before the allreduce. Defaults to 1.
        op: `Average`, `Sum` or `Adasum` (the gradients are reduced with
            Adasum; Horovod's Adasum optimizer reduces the update instead).
            Defaults to `Average`.
        gradient_predivide_factor: With `Average`, divides the gradients by
            this factor before the sum and by `size / factor` after.
            Defaults to 1.0.
        num_groups: Deprecated: the number of groups to split the
            parameters in (see `groups`). Defaults to 0.
        groups: An integer (split the parameters into that many groups) or
            a list of lists of parameters; each group is reduced as one
            grouped allreduce once all its gradients are ready. Defaults to
            `None`: buckets of consecutive parameters of up to 4 MiB
            (`KERASDIST_TORCH_BUCKET_BYTES`; 0 for one allreduce per
            parameter), filled from the last parameter, as DDP does, so that
            the backward pass starts few, large allreduces.
        sparse_as_dense: Reduce sparse gradients as dense tensors.
            Defaults to False (allgather indices and values).
        process_set: The `ProcessSet` to reduce over. Defaults to
            `global_process_set`.

    Returns:
        An optimizer of a subclass of `optimizer`'s class.

    Example:

    >>> optimizer = torch.optim.Adam(model.parameters(), lr=1e-3 * hvd.size())  # doctest: +SKIP
    >>> optimizer = hvd.DistributedOptimizer(  # doctest: +SKIP
    ...     optimizer, named_parameters=model.named_parameters())
    """
    if num_groups:
        warnings.warn("`num_groups` is deprecated, as in Horovod; use `groups`.",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    op = _ops.resolve_op(op, None, "DistributedOptimizer")
    if op not in (_ops.Average, _ops.Sum, _ops.Adasum):
        raise ValueError("Invalid value for argument `op` of `DistributedOptimizer`. Expected "
                         f"Average, Sum or Adasum. Received: op={op!r}")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression,
               backward_passes_per_step, op, gradient_predivide_factor, groups,
               sparse_as_dense, process_set)
