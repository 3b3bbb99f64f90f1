"""Input pipelines for data-parallel training: sharding and equal step counts.

`tf.data` pipelines: `shard`, `shard_files`, `distribute_dataset`,
`tfds_split`. Numpy arrays and PyTorch `DataLoader`s (any Keras backend):
`shard_arrays`, `DistributedSampler`. Step counts: `steps_per_epoch`,
`check_equal_steps`.

Every rank must run the same number of steps per epoch: each step ends in
collectives, and a rank with one batch more than the others waits forever in
a collective the others never issue. These helpers give ranks disjoint data
and make (or check) the step counts equal, failing fast instead of hanging.
"""

import hashlib
import importlib

import numpy as np

from kerasdist._data_arrays import DistributedSampler, shard_arrays  # noqa: F401
from kerasdist.common.basics import rank, size
from kerasdist.common.objects import allgather_object


class _TensorFlow:
    """`tf`, imported on first use: `shard_arrays` and `DistributedSampler`
    (numpy inputs, PyTorch `DataLoader`s) need no TensorFlow."""

    def __getattr__(self, name):
        return getattr(importlib.import_module("tensorflow"), name)


tf = _TensorFlow()

_NAME_PREFIX = "kerasdist.data"


def _check_int(name, value, minimum, allow_none=False):
    if value is None and allow_none:
        return None
    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not is_int or value < minimum:
        none = " or None" if allow_none else ""
        raise ValueError(
            f"Invalid value for argument `{name}`. Expected an integer >= "
            f"{minimum}{none}. Received: {name}={value!r}"
        )
    return int(value)


def _check_dataset(dataset):
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            "Invalid value for argument `dataset`. Expected a "
            f"`tf.data.Dataset`. Received: dataset={dataset!r} of type "
            f"{type(dataset).__name__}"
        )


def shard(dataset):
    """Returns this rank's element-wise shard of `dataset`.

    Rank `r` of `n` keeps elements `r, r + n, r + 2n, ...`, so the shards are
    disjoint and together hold every element. Shard sizes differ by at most
    one; use `distribute_dataset` (which truncates to the smallest shard) or
    `steps_per_epoch` to run the same number of steps on every rank.

    Args:
        dataset: A `tf.data.Dataset`, in the same order on every rank.

    Returns:
        A `tf.data.Dataset` with this rank's elements.

    Raises:
        TypeError: If `dataset` is not a `tf.data.Dataset`.

    Example:

    >>> ds = kerasdist.data.shard(tf.data.Dataset.range(10))
    """
    _check_dataset(dataset)
    return dataset.shard(size(), rank())


def check_equal_steps(steps, name="steps_per_epoch"):
    """Checks that every rank passes the same number of steps.

    A collective: call it on every rank, eagerly (before `model.fit()`).
    Unequal step counts would make the ranks with more steps wait forever
    in collectives that the others never issue; this fails fast instead,
    with the same error on every rank.

    Args:
        steps: This rank's number of steps (a non-negative integer).
        name: What the steps are, for the error message; also names the
            collective, so use the same value on every rank. Defaults to
            `"steps_per_epoch"`.

    Returns:
        `steps`, as a Python int.

    Raises:
        ValueError: If `steps` or `name` is invalid, or if the ranks passed
            different values (the message lists every rank's value).

    Example:

    >>> steps = kerasdist.data.check_equal_steps(len(local_files) // 4)  # doctest: +SKIP
    """
    steps = _check_int("steps", steps, 0)
    if not isinstance(name, str) or not name:
        raise ValueError(
            "Invalid value for argument `name`. Expected a non-empty string. "
            f"Received: name={name!r}"
        )
    values = allgather_object(steps, name=f"{_NAME_PREFIX}.check_equal_steps.{name}")
    if len(set(values)) > 1:
        listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
        raise ValueError(
            f"The ranks have different `{name}` ({listing}). Every rank must "
            "run the same number of steps, or the ranks with more steps wait "
            "forever in collectives the others never issue. Give every rank "
            "the same number of examples (`kerasdist.data.distribute_dataset` "
            "truncates to the smallest shard), or repeat() the data and pass "
            "`kerasdist.data.steps_per_epoch(...)` to `fit()`."
        )
    return steps


def steps_per_epoch(num_examples, per_rank_batch_size, drop_remainder=True):
    """Returns the number of steps per epoch, the same on every rank.

    Each rank counts `num_examples // kerasdist.size()` examples: element-wise
    shards differ by at most one example, and the smallest shard decides.
    This only computes: it issues no collective.

    Args:
        num_examples: The number of examples in the whole (unsharded)
            dataset.
        per_rank_batch_size: The batch size of one rank (the global batch
            size divided by `kerasdist.size()`).
        drop_remainder: If `True`, a partial last batch is not counted;
            if `False`, it is (the count is rounded up, still equal on
            every rank). Defaults to `True`.

    Returns:
        The number of steps (batches) per epoch on every rank, an int.

    Raises:
        ValueError: If an argument is invalid, or if a rank would get no
            step (fewer examples than ranks or than one batch).

    Example:

    >>> model.fit(kerasdist.data.shard(ds).repeat().batch(32),  # doctest: +SKIP
    ...           steps_per_epoch=kerasdist.data.steps_per_epoch(60000, 32))
    """
    num_examples = _check_int("num_examples", num_examples, 0)
    batch = _check_int("per_rank_batch_size", per_rank_batch_size, 1)
    steps = _count_steps(num_examples, batch, drop_remainder)
    if steps == 0:
        _raise_no_step(num_examples, batch, drop_remainder)
    return steps


def _count_steps(num_examples, batch, drop_remainder):
    per_rank = num_examples // size()
    return per_rank // batch if drop_remainder else -(-per_rank // batch)


def _raise_no_step(num_examples, batch, drop_remainder):
    n = size()
    raise ValueError(
        f"No step per epoch: num_examples={num_examples} split across {n} "
        f"ranks leaves {num_examples // n} examples per rank, fewer than one "
        f"full batch of per_rank_batch_size={batch} (drop_remainder="
        f"{drop_remainder}). Use more data, a smaller batch or fewer ranks."
    )


def shard_files(file_pattern_or_list, shuffle=True, seed=0, epoch=0):
    """Returns this rank's files, for file-level sharding before interleave.

    The files are sorted, then (if `shuffle`) permuted with a permutation
    drawn from `(seed, epoch)` that is the same on every rank, and rank `r`
    of `n` keeps files `r, r + n, r + 2n, ...` of that order. Sharding files
    rather than elements means each rank reads only its own files. Pass a
    new `epoch` each epoch to change which rank reads which file.

    A collective (the sorted file lists are hashed and compared, so all
    ranks must see the same files): call it on every rank, eagerly.

    Ranks may get one file more than others, so their example counts may
    differ: check with `check_equal_steps`, or repeat() the data and pass
    `steps_per_epoch` to `fit()`.

    Args:
        file_pattern_or_list: A glob pattern (expanded with
            `tf.io.gfile.glob`) or a list of file names.
        shuffle: Whether to permute the sorted files before sharding.
            Defaults to `True`.
        seed: Seed of the permutation, an integer in `[0, 2**32)`.
            Defaults to `0`.
        epoch: Epoch number, mixed into the permutation, an integer in
            `[0, 2**32)`. Defaults to `0`.

    Returns:
        A `tf.data.Dataset` of this rank's file names (`tf.string`).

    Raises:
        ValueError: If an argument is invalid, no file matches, the ranks
            see different files, or there are fewer files than ranks.

    Example:

    >>> files = kerasdist.data.shard_files("/data/train-*.tfrecord", epoch=0)  # doctest: +SKIP
    >>> ds = files.interleave(tf.data.TFRecordDataset,  # doctest: +SKIP
    ...                       num_parallel_calls=tf.data.AUTOTUNE)
    """
    files = file_pattern_or_list
    if isinstance(files, str):
        files = tf.io.gfile.glob(files)
        if not files:
            raise ValueError(
                "Invalid value for argument `file_pattern_or_list`. Expected "
                "a pattern that matches at least one file. Received: "
                f"file_pattern_or_list={file_pattern_or_list!r} (no match)"
            )
    elif not (isinstance(files, (list, tuple)) and files
              and all(isinstance(f, str) for f in files)):
        raise ValueError(
            "Invalid value for argument `file_pattern_or_list`. Expected a "
            "glob pattern or a non-empty list of file names (strings). "
            f"Received: file_pattern_or_list={file_pattern_or_list!r}"
        )
    seed = _check_int("seed", seed, 0)
    epoch = _check_int("epoch", epoch, 0)
    if seed >= 2**32 or epoch >= 2**32:
        raise ValueError(
            "Invalid value for argument `seed` or `epoch`. Expected integers "
            f"in [0, 2**32). Received: seed={seed}, epoch={epoch}"
        )
    files = sorted(files)
    digest = hashlib.sha256("\n".join(files).encode()).hexdigest()
    # Check across ranks before anything that raises on some ranks only.
    seen = allgather_object((len(files), digest), name=f"{_NAME_PREFIX}.shard_files")
    if len(set(seen)) > 1:
        listing = ", ".join(f"rank {r}: {c} files (sha256 {d[:12]})"
                            for r, (c, d) in enumerate(seen))
        raise ValueError(
            "`shard_files` needs the same files on every rank, but the ranks "
            f"see different file lists ({listing}). Make the same files "
            "visible on every host (e.g. a shared file system), or pass an "
            "explicit list that is equal on every rank."
        )
    n = size()
    if len(files) < n:
        raise ValueError(
            f"`shard_files` needs at least as many files as ranks, but got "
            f"{len(files)} files for {n} ranks: some ranks would get no "
            "data. Split the data into more files, use fewer ranks, or "
            "shard element-wise with `kerasdist.data.shard()`."
        )
    if shuffle:
        order = np.random.RandomState([seed, epoch]).permutation(len(files))
        files = [files[i] for i in order]
    mine = files[rank()::n]
    return tf.data.Dataset.from_tensor_slices(tf.constant(mine, dtype=tf.string))


def distribute_dataset(dataset, global_batch_size=None, per_rank_batch_size=None,
                       shuffle_buffer=None, seed=None, drop_remainder=True):
    """Shards, shuffles and batches a dataset with equal steps on every rank.

    The dataset is sharded element-wise (`shard`), truncated to the smallest
    shard (`num_examples // kerasdist.size()` elements, so no rank gets an
    extra batch), optionally shuffled, and batched per rank: every rank has
    the same number of batches per epoch. A collective (the counts are
    checked across ranks): call it on every rank, eagerly.

    The cardinality of `dataset` must be known and finite: otherwise the
    batches per rank cannot be made equal, and a rank with one batch more
    would wait forever in a collective that the others never issue, so
    kerasdist fails fast instead. Either declare the size with
    `dataset.apply(tf.data.experimental.assert_cardinality(n))`, or build
    the pipeline yourself with `kerasdist.data.shard(dataset).repeat()` and
    pass `steps_per_epoch=kerasdist.data.steps_per_epoch(n, batch)` to
    `fit()`.

    Give exactly one batch size. `global_batch_size` counts the examples of
    one step over all ranks (the batch size of the equivalent single-process
    run); it must be divisible by `kerasdist.size()`, and each rank batches
    `global_batch_size // kerasdist.size()`. `per_rank_batch_size` is one
    rank's batch size (the global batch is `kerasdist.size()` times larger).

    Args:
        dataset: A `tf.data.Dataset` of single examples with a known, finite
            cardinality, in the same order on every rank.
        global_batch_size: Examples per step over all ranks. Defaults to
            `None`.
        per_rank_batch_size: Examples per step on one rank. Defaults to
            `None`.
        shuffle_buffer: Size of the shuffle buffer applied to this rank's
            shard (reshuffled each iteration), or `None` not to shuffle.
            Defaults to `None`.
        seed: Seed of the shuffle, or `None` for a random one. Defaults to
            `None`.
        drop_remainder: Whether to drop the partial last batch. If `False`,
            the last batch may be partial, but the number of batches is
            still the same on every rank. Defaults to `True`.

    Returns:
        A tuple `(dataset, steps_per_epoch)`: this rank's `tf.data.Dataset`
        of per-rank batches, and the number of batches it yields per epoch
        (an int, equal on all ranks).

    Raises:
        TypeError: If `dataset` is not a `tf.data.Dataset`.
        ValueError: If the cardinality is unknown or infinite, the batch
            sizes are invalid (none or both given, or a global batch size
            not divisible by the number of ranks), a rank would get no
            batch, or the ranks end up with different step counts.

    Example:

    >>> ds = tf.data.Dataset.from_tensor_slices((x_train, y_train))  # doctest: +SKIP
    >>> ds, steps = kerasdist.data.distribute_dataset(  # doctest: +SKIP
    ...     ds, global_batch_size=256, shuffle_buffer=10000, seed=1)
    >>> model.fit(ds, epochs=3)  # doctest: +SKIP
    """
    _check_dataset(dataset)
    n = size()
    if (global_batch_size is None) == (per_rank_batch_size is None):
        raise ValueError(
            "Expected exactly one of the arguments `global_batch_size` and "
            f"`per_rank_batch_size`. Received: global_batch_size="
            f"{global_batch_size!r}, per_rank_batch_size={per_rank_batch_size!r}"
        )
    if global_batch_size is not None:
        global_batch_size = _check_int("global_batch_size", global_batch_size, 1)
        if global_batch_size % n:
            raise ValueError(
                "Invalid value for argument `global_batch_size`. Expected a "
                f"multiple of the number of ranks ({n}). Received: "
                f"global_batch_size={global_batch_size}"
            )
        batch = global_batch_size // n
    else:
        batch = _check_int("per_rank_batch_size", per_rank_batch_size, 1)
    shuffle_buffer = _check_int("shuffle_buffer", shuffle_buffer, 1, allow_none=True)
    seed = _check_int("seed", seed, 0, allow_none=True)

    cardinality = int(dataset.cardinality())
    # Agree on the input first, so that every later error is raised on
    # every rank (an error on some ranks only would leave the others
    # waiting in the next collective).
    seen = allgather_object(cardinality, name=f"{_NAME_PREFIX}.distribute_dataset.cardinality")
    if len(set(seen)) > 1:
        listing = ", ".join(f"rank {r}: {c}" for r, c in enumerate(seen))
        raise ValueError(
            "`distribute_dataset` needs the same (unsharded) dataset on every "
            f"rank, but the ranks' datasets have different cardinalities "
            f"({listing}; -1 is infinite, -2 unknown)."
        )
    if cardinality < 0:
        kind = ("infinite" if cardinality == tf.data.INFINITE_CARDINALITY
                else "unknown")
        raise ValueError(
            f"`distribute_dataset` needs a dataset with a known, finite "
            f"cardinality, but this one is {kind}. Without it the ranks "
            "could run different numbers of steps, and the rank with more "
            "steps would wait forever in a collective. Declare the size with "
            "`dataset.apply(tf.data.experimental.assert_cardinality(n))`, "
            "or repeat() `kerasdist.data.shard(dataset)` yourself and pass "
            "`steps_per_epoch=kerasdist.data.steps_per_epoch(n, batch)` to "
            "`fit()`."
        )
    steps = check_equal_steps(_count_steps(cardinality, batch, drop_remainder),
                              name="distribute_dataset.steps_per_epoch")
    if steps == 0:
        _raise_no_step(cardinality, batch, drop_remainder)
    # Truncate every shard to the smallest one: no rank gets an extra batch.
    ds = dataset.shard(n, rank()).take(cardinality // n)
    if shuffle_buffer is not None:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch, drop_remainder=drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE), steps


def tfds_split(split="train", drop_remainder=True):
    """Returns this rank's part of a TensorFlow Datasets split.

    The split is cut into `kerasdist.size()` parts with `tfds.even_splits`
    and rank `r` gets part `r`: pass it as `tfds.load(..., split=...)`, so
    each rank reads only its own examples. Do not shard the result again
    (e.g. with `distribute_dataset`): batch it yourself and confirm the step
    count with `check_equal_steps`.

    Args:
        split: The split to divide, e.g. `"train"` or `"train[:80%]"`.
            Defaults to `"train"`.
        drop_remainder: If `True`, drop the few examples left over so that
            every part has the same size (and so the same number of steps);
            if `False`, parts may differ by one example. Defaults to `True`.

    Returns:
        This rank's split, a value that `tfds.load(split=...)` accepts.

    Raises:
        ImportError: If `tensorflow-datasets` (or its undeclared dependency
            `importlib_resources`) is not installed.
        ValueError: If `split` is not a non-empty string.

    Example:

    >>> ds = tfds.load("mnist", split=kerasdist.data.tfds_split("train"))  # doctest: +SKIP
    """
    if not isinstance(split, str) or not split:
        raise ValueError(
            "Invalid value for argument `split`. Expected a non-empty split "
            f"string such as 'train'. Received: split={split!r}"
        )
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(
            "`kerasdist.data.tfds_split` needs TensorFlow Datasets, which "
            f"could not be imported ({e}). Install it with "
            "`pip install kerasdist[tfds]` (tensorflow-datasets and "
            "importlib_resources)."
        ) from e
    return tfds.even_splits(split, n=size(), drop_remainder=drop_remainder)[rank()]
