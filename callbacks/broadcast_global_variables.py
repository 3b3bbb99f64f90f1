"""`BroadcastGlobalVariablesCallback`: start every rank from the same state."""

import keras

from kerasdist._keras import backend as _backend


def _shared_variables(model, local_variables=()):
    """Model and optimizer variables, in the same order on every rank.

    Random-seed states (dropout and friends) are left per rank, so that each
    rank keeps drawing its own masks, as it reads its own data; so are
    `local_variables`.
    """
    variables = [v for v in model.variables if "seed_generator" not in v.path]
    opt = getattr(model, "optimizer", None)
    if opt is not None:
        variables += list(opt.variables)
    local = {id(v) for v in local_variables or ()}
    return [v for v in variables if id(v) not in local]


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcasts model and optimizer state from `root_rank` before training.

    Unlike Horovod, which broadcasts after the first batch (so the first step
    runs on unsynchronized weights), this builds the optimizer at
    `on_train_begin` and broadcasts model **and** optimizer variables before
    the first step. Only a model that is not built yet at that point falls
    back to broadcasting after batch 0.

    Args:
        root_rank: The rank whose state is kept. Defaults to 0.
        device: Unused; accepted for Horovod compatibility. Defaults to "".
        local_variables: Variables to leave out of the broadcast (each rank
            keeps its own), e.g. those of a
            `PartialDistributedOptimizer`'s local layers. Defaults to `None`.

    Example:

    >>> model.fit(x, y, callbacks=[  # doctest: +SKIP
    ...     kerasdist.callbacks.BroadcastGlobalVariablesCallback(0)])
    """

    # kerasdist's fit guard: its batch hooks never set `stop_training`.
    _kerasdist_never_stops = True

    def __init__(self, root_rank=0, device="", local_variables=None):
        super().__init__()
        del device
        self.root_rank = root_rank
        self.local_variables = list(local_variables or ())
        self.broadcast_done = False

    def _broadcast(self):
        opt = getattr(self.model, "optimizer", None)
        if opt is not None and not opt.built:
            opt.build(self.model.trainable_variables)
        _backend.broadcast_variables(_shared_variables(self.model, self.local_variables),
                            self.root_rank,
                            name="broadcast_global_variables")
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        if not self.broadcast_done and self.model.built:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast()
