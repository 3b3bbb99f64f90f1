"""`UnevenDataCallback`: ranks with different amounts of data never hang."""

import keras

from kerasdist._keras import backend as _backend
from kerasdist.callbacks.broadcast_global_variables import _shared_variables
from kerasdist.common.objects import allgather_object


class UnevenDataCallback(keras.callbacks.Callback):
    """Keeps `fit` safe when ranks have different numbers of batches.

    The classic failure: one rank has one more batch than another, takes one
    more step, and waits forever in its gradient allreduce. This callback
    does one of two things, decided at `on_train_begin`:

    - If every rank's steps per epoch is known (finite dataset cardinality or
      `steps_per_epoch`) and they differ, it raises a `ValueError` on every
      rank before the first step, naming each rank's count. Equal counts are
      what `kerasdist.data.distribute_dataset` produces.
    - If some rank's count is unknown (e.g. a generator or a filtered
      dataset), each rank calls `kerasdist.join()` when its data runs out:
      until every rank has joined, it takes part in the others' gradient
      allreduces with zeros and is left out of their averages. Then all
      ranks take the model and optimizer state of the rank that joined last,
      so replicas stay identical, and the epoch ends at the same point
      everywhere.

    Put it **first** in the callbacks list (before `MetricAverageCallback`),
    so that the epoch-end collectives of all ranks line up.

    Example:

    >>> model.fit(dataset, callbacks=[kerasdist.callbacks.UnevenDataCallback(),  # doctest: +SKIP
    ...     kerasdist.callbacks.BroadcastGlobalVariablesCallback(0)])
    """

    # kerasdist's fit guard: its batch hooks never set `stop_training`.
    _kerasdist_never_stops = True

    def __init__(self):
        super().__init__()
        self.join_each_epoch = False
        self.last_joined = None

    def on_train_begin(self, logs=None):
        steps = allgather_object(self.params.get("steps"), name="uneven_data.steps")
        if all(s is not None for s in steps):
            if len(set(steps)) > 1:
                counts = ", ".join(f"rank {r}: {s}" for r, s in enumerate(steps))
                raise ValueError(
                    "Ranks have different numbers of steps per epoch "
                    f"({counts}); the rank with more steps would wait forever "
                    "for the others. Shard and batch with "
                    "`kerasdist.data.distribute_dataset`, or pass the same "
                    "`steps_per_epoch` on every rank."
                )
            self.join_each_epoch = False
        else:
            self.join_each_epoch = True

    def on_epoch_end(self, epoch, logs=None):
        if not self.join_each_epoch:
            return
        self.last_joined = _backend.join()
        _backend.broadcast_variables(_shared_variables(self.model), self.last_joined,
                            name=f"uneven_data.sync.{epoch}")
