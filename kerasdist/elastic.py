"""Horovod's elastic state API, for restarts of a whole MPI job.

Horovod's elastic mode replaces lost workers inside the running processes.
On MPI that is not possible: a lost rank ends the job. So here recovery is
a restart of the job, `kerasdist-run --max-restarts N ...`, from the last
commit: `state.commit()` keeps the state in memory (for `restore()`) and
rank 0 also writes it to disk, atomically; in a restarted job (the ranks see
`KERASDIST_RESTART=<n>`), `kerasdist.elastic.run` reads it back on rank 0
and broadcasts it before calling the training function, which continues
from the committed epoch and batch.

Example:

```python
state = kerasdist.elastic.KerasState(model, optimizer, batch=0, epoch=0)

@kerasdist.elastic.run
def train(state):
    for epoch in range(state.epoch, EPOCHS):
        start = state.batch  # batches of this epoch already done
        model.fit(batches(epoch).skip(start), steps_per_epoch=STEPS - start,
                  initial_epoch=epoch, epochs=epoch + 1, callbacks=[
                      kerasdist.elastic.UpdateEpochStateCallback(state),
                      kerasdist.elastic.UpdateBatchStateCallback(state),
                      kerasdist.elastic.CommitStateCallback(state)])

train(state)
```
"""

import copy
import functools
import os
import pickle

from kerasdist._keras.elastic_callbacks import (CommitStateCallback,  # noqa: F401
                                                UpdateBatchStateCallback,
                                                UpdateEpochStateCallback)
from kerasdist.common.context import check_initialized, context
from kerasdist.common.files import atomic_save
from kerasdist.tensorflow import functions

_FORMAT = 1
_FILE = "state.pkl"


def restart_count():
    """The restart this job is (0 for the first run), from
    `KERASDIST_RESTART`, which `kerasdist-run --max-restarts` sets."""
    raw = os.environ.get("KERASDIST_RESTART", "").strip()
    try:
        return max(0, int(raw)) if raw else 0
    except ValueError:
        raise ValueError(
            "Invalid value for environment variable KERASDIST_RESTART. "
            f"Expected an integer >= 0. Received: KERASDIST_RESTART={raw!r}"
        ) from None


class State:
    """Base of the elastic states: named attributes kept across restarts.

    Args:
        checkpoint_dir: Where rank 0 writes each commit. Defaults to `None`:
            `$KERASDIST_ELASTIC_DIR`, else `./kerasdist_elastic`. Only rank 0
            needs access to it.
        **kwargs: Attributes (e.g. `epoch=0`, `batch=0`); picklable values.
    """

    def __init__(self, checkpoint_dir=None, **kwargs):
        directory = checkpoint_dir or os.environ.get("KERASDIST_ELASTIC_DIR") or os.path.join(
            os.getcwd(), "kerasdist_elastic")
        self.__dict__["_dir"] = os.fspath(directory)
        self.__dict__["_names"] = list(kwargs)
        self.__dict__["_reset_callbacks"] = []
        self.__dict__["_saved"] = None
        for name, value in kwargs.items():
            self.__dict__[name] = value

    @property
    def checkpoint_path(self):
        """The file rank 0 writes at each commit."""
        return os.path.join(self._dir, _FILE)

    def register_reset_callbacks(self, callbacks):
        """Functions called (with no argument) in a restarted job after the
        state is restored, e.g. to rescale the learning rate for a new
        `size()`."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def check_host_updates(self):
        """Does nothing: the hosts of a running MPI job never change."""

    # What subclasses extend.
    def _snapshot(self):
        return {"attrs": {n: copy.deepcopy(self.__dict__[n]) for n in self._names}}

    def _apply(self, snapshot):
        for name, value in snapshot["attrs"].items():
            self.__dict__[name] = copy.deepcopy(value)
            if name not in self._names:
                self._names.append(name)

    def _variables(self):
        return []

    def commit(self):
        """Saves the state in memory and, on rank 0, to disk (atomically)."""
        check_initialized()
        snapshot = self._snapshot()
        self.__dict__["_saved"] = snapshot
        if context.rank == 0:
            def write(path):
                with open(path, "wb") as f:
                    pickle.dump({"format": _FORMAT, "state": snapshot}, f)

            atomic_save(write, self.checkpoint_path)
        self.check_host_updates()

    def restore(self):
        """Returns to the last commit held in memory (a no-op before one)."""
        if self._saved is not None:
            self._apply(self._saved)

    def sync(self):
        """Makes every rank's state rank 0's (variables and attributes)."""
        check_initialized()
        variables = self._variables()
        if variables:
            functions.broadcast_variables(variables, root_rank=0,
                                          name="kerasdist.elastic.sync")
        attrs = functions.broadcast_object(
            {n: self.__dict__[n] for n in self._names}, root_rank=0,
            name="kerasdist.elastic.sync.attrs")
        self._apply({"attrs": attrs})

    def _load_committed(self):
        """Rank 0 reads the last commit; every rank gets the same outcome.

        Returns True if a commit was found and applied on rank 0.
        """
        outcome = (False, None)
        if context.rank == 0 and os.path.exists(self.checkpoint_path):
            try:
                with open(self.checkpoint_path, "rb") as f:
                    data = pickle.load(f)
                if data.get("format") != _FORMAT:
                    raise ValueError(f"unknown format {data.get('format')!r}")
                self._apply(data["state"])
                self.__dict__["_saved"] = data["state"]
                outcome = (True, None)
            except Exception as e:  # the same error on every rank below
                outcome = (False, f"{type(e).__name__}: {e}")
        found, error = functions.broadcast_object(
            outcome, root_rank=0, name="kerasdist.elastic.load")
        if error:
            raise RuntimeError(
                f"kerasdist.elastic: the committed state {self.checkpoint_path} "
                f"could not be restored on rank 0: {error}. Delete it to "
                "start from scratch.")
        return found

    def __setattr__(self, name, value):
        if name not in self._names and not name.startswith("_"):
            self._names.append(name)
        self.__dict__[name] = value


class ObjectState(State):
    """A state of plain Python attributes (Horovod's `ObjectState`).

    Args:
        bcast_object, get_rank: Unused; accepted for Horovod compatibility.
        checkpoint_dir: As in `State`.
        **kwargs: The attributes.
    """

    def __init__(self, bcast_object=None, get_rank=None, checkpoint_dir=None, **kwargs):
        del bcast_object, get_rank
        super().__init__(checkpoint_dir=checkpoint_dir, **kwargs)


class TensorFlowKerasState(State):
    """A Keras model's weights, its optimizer's state and attributes.

    Args:
        model: A built Keras model.
        optimizer: Its optimizer. Defaults to `None` (`model.optimizer`).
        backend: Unused; accepted for Horovod compatibility.
        checkpoint_dir: As in `State`.
        **kwargs: Attributes, e.g. `epoch=0, batch=0`.

    Example:

    >>> state = kerasdist.elastic.KerasState(model, batch=0, epoch=0)
    """

    def __init__(self, model, optimizer=None, backend=None, checkpoint_dir=None,
                 **kwargs):
        del backend
        super().__init__(checkpoint_dir=checkpoint_dir, **kwargs)
        self.__dict__["model"] = model
        self.__dict__["optimizer"] = optimizer if optimizer is not None else getattr(
            model, "optimizer", None)

    def _optimizer_variables(self):
        opt = self.optimizer
        if opt is None:
            return []
        if not opt.built:
            opt.build(self.model.trainable_variables)
        return list(opt.variables)

    def _variables(self):
        return list(self.model.weights) + self._optimizer_variables()

    def _snapshot(self):
        snap = super()._snapshot()
        snap["model"] = [w.numpy() for w in self.model.weights]
        snap["optimizer"] = [v.numpy() for v in self._optimizer_variables()]
        return snap

    def _apply(self, snapshot):
        super()._apply(snapshot)
        if "model" not in snapshot:
            return
        for what, variables in (("model", list(self.model.weights)),
                                ("optimizer", self._optimizer_variables())):
            values = snapshot[what]
            if len(values) != len(variables):
                raise ValueError(
                    f"The committed state has {len(values)} {what} variables, "
                    f"this {what} has {len(variables)}.")
            for var, value in zip(variables, values):
                var.assign(value)


KerasState = TensorFlowKerasState


class TensorFlowState(State):
    """A list of TensorFlow variables and attributes (Horovod's
    `TensorFlowState`), eagerly or in a `tf.compat.v1` graph.

    As in Horovod, the variables' values are held in memory from the start:
    `restore()` returns to the values of construction, of the last `sync()`
    or of the last `commit()`, whichever came last. `commit()` also writes
    them to disk on rank 0 (see `State`), for a restarted job.

    Args:
        variables: The `tf.Variable`s, in the same order on every rank.
            Defaults to `None` (`tf.compat.v1.global_variables()`, as in
            Horovod; empty when executing eagerly).
        session: The `tf.compat.v1.Session` that reads, assigns and
            broadcasts the variables in a graph. Defaults to `None` (the
            default session; unused when executing eagerly).
        checkpoint_dir: As in `State`.
        **kwargs: Attributes, e.g. `epoch=0, batch=0`.

    Raises:
        ValueError: In a `tf.compat.v1` graph without a session.

    Example:

    >>> state = kerasdist.elastic.TensorFlowState(model.variables, batch=0)
    >>> state.sync()
    """

    def __init__(self, variables=None, session=None, checkpoint_dir=None, **kwargs):
        import tensorflow as tf

        super().__init__(checkpoint_dir=checkpoint_dir, **kwargs)
        variables = list(variables) if variables else list(tf.compat.v1.global_variables())
        self.__dict__["variables"] = variables
        self.__dict__["session"] = None
        self.__dict__["_graph_ops"] = None
        if not tf.executing_eagerly():
            session = session or tf.compat.v1.get_default_session()
            if session is None:
                raise ValueError(
                    "Invalid value for argument `session` of `TensorFlowState`. "
                    "Expected a `tf.compat.v1.Session` (or a default session) in "
                    "a `tf.compat.v1` graph. Received: session=None")
            self.__dict__["session"] = session
            # Built once: later syncs and restores only run them.
            values = [tf.compat.v1.placeholder(v.dtype, v.shape) for v in variables]
            self.__dict__["_graph_ops"] = (
                functions.broadcast_variables(variables, root_rank=0,
                                              name="kerasdist.elastic.sync"),
                values, [v.assign(x) for v, x in zip(variables, values)])
        self.__dict__["_saved"] = self._snapshot()

    def _variables(self):
        return list(self.variables)

    def _snapshot(self):
        snap = super()._snapshot()
        if self.session is not None:
            snap["variables"] = list(self.session.run(self.variables))
        else:
            snap["variables"] = [v.numpy() for v in self.variables]
        return snap

    def _apply(self, snapshot):
        super()._apply(snapshot)
        if "variables" not in snapshot:
            return
        values = snapshot["variables"]
        if len(values) != len(self.variables):
            raise ValueError(
                f"The committed state has {len(values)} variables, this "
                f"state has {len(self.variables)}.")
        if self.session is None:
            for var, value in zip(self.variables, values):
                var.assign(value)
        else:
            _, feeds, assigns = self._graph_ops
            self.session.run(assigns, feed_dict=dict(zip(feeds, values)))

    def sync(self):
        """Makes every rank's variables and attributes rank 0's, and holds
        them in memory for `restore()`, as in Horovod."""
        check_initialized()
        if self.session is None:
            super().sync()
        else:
            self.session.run(self._graph_ops[0])
            attrs = functions.broadcast_object(
                {n: self.__dict__[n] for n in self._names}, root_rank=0,
                session=self.session, name="kerasdist.elastic.sync.attrs")
            self._apply({"attrs": attrs})
        self.__dict__["_saved"] = self._snapshot()


def run(func):
    """Decorates a training function `func(state, ...)` for restarts.

    Before calling `func`: in a restarted job, rank 0 reads the last commit
    from disk; then `state.sync()` gives every rank rank 0's state; in a
    restarted job the state's reset callbacks run. Failures are not retried
    in the process (on MPI a lost rank ends the job): run the script under
    `kerasdist-run --max-restarts N`.

    Args:
        func: A function whose first argument is a `State`.

    Returns:
        The wrapped function.
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        check_initialized()
        restarted = restart_count() > 0
        if restarted:
            state._load_committed()
        state.sync()
        if restarted:
            state.on_reset()
        return func(state, *args, **kwargs)

    return wrapper


__all__ = ["CommitStateCallback", "KerasState", "ObjectState", "State",
           "TensorFlowKerasState", "TensorFlowState", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "restart_count", "run"]
