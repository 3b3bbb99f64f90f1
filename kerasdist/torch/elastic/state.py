"""`TorchState`: a PyTorch model, its optimizer and attributes, kept
across restarts of the job."""

import copy

import torch

from kerasdist.common.elastic import State
from kerasdist.torch import functions


class TorchState(State):
    """A model's and an optimizer's state and named attributes (Horovod's
    `TorchState`).

    `commit()` holds a copy in memory (for `restore()`) and writes it to
    disk on rank 0; `sync()` gives every rank rank 0's model, optimizer and
    attributes; in a restarted job `kerasdist.torch.elastic.run` loads the
    last commit on rank 0 and syncs it.

    Args:
        model: A `torch.nn.Module`, or `None`.
        optimizer: A `torch.optim.Optimizer`, or `None`.
        checkpoint_dir: Where rank 0 writes each commit. Defaults to `None`:
            `$KERASDIST_ELASTIC_DIR`, else `./kerasdist_elastic`.
        **kwargs: Attributes (e.g. `epoch=0, batch=0`): picklable values,
            or objects with `state_dict()` and `load_state_dict()` (such as
            `ElasticSampler`), which are kept by their state.

    Example:

    >>> state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)  # doctest: +SKIP
    """

    def __init__(self, model=None, optimizer=None, checkpoint_dir=None, **kwargs):
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError("Invalid type for argument `model` of `TorchState`. Expected a "
                            f"torch.nn.Module. Received: {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("Invalid type for argument `optimizer` of `TorchState`. "
                            f"Expected a torch.optim.Optimizer. Received: "
                            f"{type(optimizer).__name__}")
        super().__init__(checkpoint_dir=checkpoint_dir, **kwargs)
        self.__dict__["model"] = model
        self.__dict__["optimizer"] = optimizer
        self.__dict__["_saved"] = self._snapshot()

    def _stateful(self):
        """Attributes kept by their own `state_dict()` (e.g. samplers)."""
        return [n for n in self._names
                if hasattr(self.__dict__[n], "state_dict")
                and hasattr(self.__dict__[n], "load_state_dict")]

    def _snapshot(self):
        stateful = self._stateful()
        plain = [n for n in self._names if n not in stateful]
        snap = {"attrs": {n: copy.deepcopy(self.__dict__[n]) for n in plain},
                "stateful": {n: copy.deepcopy(self.__dict__[n].state_dict())
                             for n in stateful}}
        if self.model is not None:
            snap["model"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        if self.optimizer is not None:
            snap["optimizer"] = copy.deepcopy(self.optimizer.state_dict())
        return snap

    def _apply(self, snapshot):
        super()._apply(snapshot)
        for name, value in snapshot.get("stateful", {}).items():
            self.__dict__[name].load_state_dict(copy.deepcopy(value))
        if self.model is not None and "model" in snapshot:
            self.model.load_state_dict(snapshot["model"])
        if self.optimizer is not None and "optimizer" in snapshot:
            self.optimizer.load_state_dict(copy.deepcopy(snapshot["optimizer"]))

    def _sync_tensors(self):
        if self.model is not None:
            functions.broadcast_parameters(self.model.state_dict(), root_rank=0,
                                           prefix="elastic.")
        if self.optimizer is not None:
            functions.broadcast_optimizer_state(self.optimizer, root_rank=0, prefix="elastic")

    def sync(self):
        """Makes every rank's model, optimizer and attributes rank 0's, and
        holds them in memory for `restore()`, as in Horovod."""
        stateful = self._stateful()
        self._sync_tensors()
        attrs = functions.broadcast_object(
            {n: self.__dict__[n] for n in self._names if n not in stateful}, root_rank=0,
            name="kerasdist.elastic.sync.attrs")
        states = functions.broadcast_object(
            {n: self.__dict__[n].state_dict() for n in stateful}, root_rank=0,
            name="kerasdist.elastic.sync.stateful")
        self._apply({"attrs": attrs, "stateful": states})
        self.__dict__["_saved"] = self._snapshot()
