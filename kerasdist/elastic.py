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

from kerasdist._keras.elastic_callbacks import (CommitStateCallback,  # noqa: F401
                                                UpdateBatchStateCallback,
                                                UpdateEpochStateCallback)
from kerasdist.common.context import check_initialized
from kerasdist.common.elastic import ObjectState, State, restart_count, run  # noqa: F401
from kerasdist.tensorflow import functions


class TensorFlowKerasState(State):
    """A Keras model's weights, its optimizer's state and attributes.

    Args:
        model: A built Keras model.
        optimizer: Its optimizer. Defaults to `None` (`model.optimizer`).
        backend: Unused; accepted for Horovod compatibility.
        checkpoint_dir: As in `State`.
        **kwargs: Attributes, e.g. `epoch=0, batch=0`.

    Example:

    >>> state = kerasdist.elastic.KerasState(model, batch=0, epoch=0)  # doctest: +SKIP
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

    def _sync_tensors(self):
        variables = self._variables()
        if variables:
            functions.broadcast_variables(variables, root_rank=0,
                                          name="kerasdist.elastic.sync")

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

    >>> state = kerasdist.elastic.TensorFlowState(model.variables, batch=0)  # doctest: +SKIP
    >>> state.sync()  # doctest: +SKIP
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

    def _sync_tensors(self):
        if self.variables:
            functions.broadcast_variables(self.variables, root_rank=0,
                                          name="kerasdist.elastic.sync")

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


__all__ = ["CommitStateCallback", "KerasState", "ObjectState", "State",
           "TensorFlowKerasState", "TensorFlowState", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "restart_count", "run"]
