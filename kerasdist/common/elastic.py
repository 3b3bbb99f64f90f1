"""Horovod's elastic state API without a framework: restarts of a whole
MPI job, from the last commit.

Horovod's elastic mode replaces lost workers inside the running processes.
On MPI that is not possible: a lost rank ends the job. So here recovery is
a restart of the job, `kerasdist-run --max-restarts N ...`, from the last
commit: `state.commit()` keeps the state in memory (for `restore()`) and
rank 0 also writes it to disk, atomically; in a restarted job (the ranks see
`KERASDIST_RESTART=<n>`), `run` reads it back on rank 0 and broadcasts it
before calling the training function, which continues from the committed
epoch and batch.

The framework states build on `State`: `kerasdist.elastic` (TensorFlow and
Keras) and `kerasdist.torch.elastic` (PyTorch). A subclass extends
`_snapshot`, `_apply` and `_sync_tensors`.
"""

import copy
import functools
import os
import pickle

from kerasdist.common import objects
from kerasdist.common.context import check_initialized, context
from kerasdist.common.files import atomic_save

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

    def _sync_tensors(self):
        """Makes the framework tensors (weights, optimizer state) rank 0's;
        a subclass with tensors overrides it."""

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
        self._sync_tensors()
        attrs = objects.broadcast_object(
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
        found, error = objects.broadcast_object(
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




__all__ = ["ObjectState", "State", "restart_count", "run"]
