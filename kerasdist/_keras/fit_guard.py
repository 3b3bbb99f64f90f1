"""What `fit()` does by default for a model with a `DistributedOptimizer`.

Two ways a data-parallel `fit` used to hang, now handled without any extra
callback:

- **A stop on one rank.** `EarlyStopping` on an unaveraged metric,
  `TerminateOnNaN`, or a callback that runs on one rank only can set
  `model.stop_training` on one rank. Keras' TF `fit` loop reads that flag
  right after each batch's `on_train_batch_end` callbacks and after each
  epoch's `on_epoch_end` callbacks; a rank that breaks out alone leaves the
  others waiting in the next gradient allreduce. The guard runs after every
  user callback at those points and replaces the flag by the maximum over
  the ranks, so every rank stops after the same batch or epoch.
- **Different known step counts.** If every rank knows its number of steps
  per epoch (arrays, a dataset of known cardinality, `steps_per_epoch`) and
  they differ, `fit` raises a `ValueError` on every rank before the first
  step, naming each rank's count. Where some rank's count is unknown, the
  ranks are not compared: a rank whose data ends first waits in the
  epoch-end check while the others wait in their gradient allreduce, so one
  rank's next epoch is never paired with another's current one, and the
  engine's stall/deadlock rules apply (or use `UnevenDataCallback`).

Cost: one tiny collective at the start of `fit` and two per epoch. The check
after every batch, one small allreduce per step, is made only when some rank
has a callback that may set `stop_training` from a batch hook (for example
`TerminateOnNaN` or a user callback); Keras' own callbacks that never stop
training, and kerasdist's, do not count. Every check reuses a fixed
collective name, so no state grows with the number of steps.

Mechanism: `keras.Model.fit` is wrapped once (when the first
`DistributedOptimizer` is made); for models whose optimizer is distributed,
at more than one rank, the wrapper appends the guard to the callbacks and
otherwise calls Keras' `fit` unchanged.
"""

import functools
import inspect

import keras
import numpy as np

from kerasdist._keras import backend as _backend
from kerasdist._keras import first_update as _first_update
from kerasdist.common.context import context
from kerasdist.common.objects import allgather_object
from kerasdist.common.reduce_ops import Max

_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end",
                "on_batch_begin", "on_batch_end")

# Keras callbacks whose batch hooks never set `stop_training`.
_NEVER_STOP = tuple(
    getattr(keras.callbacks, name) for name in (
        "BackupAndRestore", "CSVLogger", "History", "LearningRateScheduler",
        "ModelCheckpoint", "ProgbarLogger", "ReduceLROnPlateau",
        "RemoteMonitor", "SwapEMAWeights", "TensorBoard")
    if hasattr(keras.callbacks, name))


def _hook_owner(callback, hook):
    for klass in type(callback).__mro__:
        if hook in vars(klass):
            return klass
    return None


def may_stop_in_batch(callback):
    """Whether `callback` may set `stop_training` from a training-batch hook.

    True when one of its batch hooks is defined by a class other than
    `keras.callbacks.Callback`, the Keras callbacks that never stop training,
    and classes marked with `_kerasdist_never_stops = True` (kerasdist's
    callbacks). Hooks set on the instance (`LambdaCallback`) count.
    """
    for hook in _BATCH_HOOKS:
        if hook in vars(callback):
            return True
        owner = _hook_owner(callback, hook)
        if owner is None or owner is keras.callbacks.Callback:
            continue
        if owner in _NEVER_STOP or vars(owner).get("_kerasdist_never_stops"):
            continue
        return True
    return False


def _steps_message(steps):
    counts = ", ".join(f"rank {r}: {s}" for r, s in enumerate(steps))
    return (
        "Every rank must run the same number of training steps per epoch, "
        f"but the ranks' step counts differ ({counts}). The ranks with more "
        "steps would wait forever for gradients the others never send. Give "
        "every rank the same number of batches: shard and batch with "
        "`kerasdist.data.distribute_dataset(...)`, or cut the arrays to a "
        "common length, or `repeat()` the data and pass the same "
        "`steps_per_epoch` on every rank (`kerasdist.data.steps_per_epoch"
        "(...)` computes it). For data whose length per rank cannot be known "
        "in advance, add `kerasdist.callbacks.UnevenDataCallback()`."
    )


class FitGuard(keras.callbacks.Callback):
    """Added last by the `fit` wrapper; see the module docstring.

    Args:
        may_stop_in_batch: Whether this rank has a callback that may set
            `stop_training` from a batch hook; the ranks agree at
            `on_train_begin` (any rank's True turns on the per-batch check
            everywhere).
    """

    _kerasdist_never_stops = True

    def __init__(self, may_stop_in_batch, process_set=None):
        super().__init__()
        self._local_batch_stops = bool(may_stop_in_batch)
        self.per_batch = False
        self._process_set = process_set  # the optimizer's (None: every rank)

    def _agree(self, name):
        local = 1 if self.model.stop_training else 0
        flag = _backend.allreduce_scalar(np.int32(local), Max, name, self._process_set)
        self.model.stop_training = bool(int(flag))

    def on_train_begin(self, logs=None):
        if not _backend.is_tensorflow():
            # On TensorFlow the first update broadcasts while the step is
            # traced, before it runs; elsewhere the step runs eagerly and the
            # first `apply` comes after the first gradients, so the replicas
            # are made equal here, before the first step.
            _first_update.sync_before_fit(self.model)
        steps = (self.params or {}).get("steps")
        if steps is not None:
            steps = int(steps)
        everyone = allgather_object((steps, self._local_batch_stops),
                                    name="kerasdist.fit.begin", process_set=self._process_set)
        counts = [s for s, _ in everyone]
        if all(s is not None for s in counts) and len(set(counts)) > 1:
            raise ValueError(_steps_message(counts))
        self.per_batch = any(b for _, b in everyone)

    def on_epoch_begin(self, epoch, logs=None):
        # A stop set in on_train_begin or on_epoch_begin takes effect after
        # batch 0; agreeing here keeps that batch-0 break the same everywhere.
        self._agree("kerasdist.fit.stop.epoch_begin")

    def on_train_batch_end(self, batch, logs=None):
        if self.per_batch:
            self._agree("kerasdist.fit.stop.batch")

    def on_epoch_end(self, epoch, logs=None):
        self._agree("kerasdist.fit.stop.epoch_end")


def _settings(model):
    """The reduction settings of `model`'s distributed optimizer, or None."""
    opt = getattr(model, "optimizer", None)
    inner = getattr(opt, "inner_optimizer", None)
    for o in (opt, inner):
        if getattr(o, "_kerasdist_distributed", False):
            return o.__dict__.get("_kerasdist_settings")
    return None


def _is_guarded(model):
    settings = _settings(model)
    return settings is not None and context.initialized and settings.size() > 1


_ORIGINAL_FIT = None
_FIT_SIGNATURE = None
_PREPARE = []  # fn(model) run before each guarded fit (given by install())
# id()s of the models inside a guarded fit (SyncStopTrainingCallback then
# leaves the agreeing to the guard).
ACTIVE = set()


def _callback_list(callbacks):
    if callbacks is None:
        return []
    return list(keras.tree.flatten(callbacks))


def _guarded_fit(self, *args, **kwargs):
    if not _is_guarded(self):
        return _ORIGINAL_FIT(self, *args, **kwargs)
    for prepare in _PREPARE:
        prepare(self)
    bound = _FIT_SIGNATURE.bind(self, *args, **kwargs)
    given = bound.arguments.get("callbacks")
    if isinstance(given, keras.callbacks.CallbackList):
        guard = FitGuard(any(may_stop_in_batch(c) for c in given.callbacks),
                         _settings(self).process_set)
        guard.set_model(self)
        guard.set_params(given.params)
        given.callbacks.append(guard)
    else:
        callbacks = _callback_list(given)
        guard = FitGuard(any(may_stop_in_batch(c) for c in callbacks),
                         _settings(self).process_set)
        bound.arguments["callbacks"] = callbacks + [guard]
    ACTIVE.add(id(self))
    try:
        return _ORIGINAL_FIT(*bound.args, **bound.kwargs)
    finally:
        ACTIVE.discard(id(self))
        if isinstance(given, keras.callbacks.CallbackList):
            given.callbacks.remove(guard)


def install(prepare=None):
    """Wraps `keras.Model.fit` once; idempotent. `prepare(model)`, if given,
    runs before each guarded `fit` (once registered)."""
    global _ORIGINAL_FIT, _FIT_SIGNATURE
    if prepare is not None and prepare not in _PREPARE:
        _PREPARE.append(prepare)
    if _ORIGINAL_FIT is not None:
        return
    original = keras.Model.fit
    if getattr(original, "_kerasdist_guarded", False):
        return

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        return _guarded_fit(self, *args, **kwargs)

    fit._kerasdist_guarded = True
    _ORIGINAL_FIT = original
    _FIT_SIGNATURE = inspect.signature(original)
    keras.Model.fit = fit
