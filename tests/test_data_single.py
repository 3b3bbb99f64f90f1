"""Size-1 tests of kerasdist.data under plain pytest: behaviour and errors."""

import sys

import numpy as np
import pytest
import tensorflow as tf

import kerasdist as kd
from kerasdist import data


@pytest.fixture(autouse=True)
def initialized():
    kd.init()
    yield


def elements(ds):
    return [x.tolist() if isinstance(x, np.ndarray) else x for x in ds.as_numpy_iterator()]


def filenames(ds):
    return [f.decode() for f in ds.as_numpy_iterator()]


def test_shard_is_identity_at_size_one():
    assert elements(data.shard(tf.data.Dataset.range(5))) == [0, 1, 2, 3, 4]
    with pytest.raises(TypeError, match="Expected a `tf.data.Dataset`"):
        data.shard([1, 2, 3])


def test_steps_per_epoch():
    assert data.steps_per_epoch(10, 3) == 3
    assert data.steps_per_epoch(10, 3, drop_remainder=False) == 4
    assert data.steps_per_epoch(np.int64(12), 4) == 3
    with pytest.raises(ValueError, match="No step per epoch"):
        data.steps_per_epoch(2, 3)
    assert data.steps_per_epoch(2, 3, drop_remainder=False) == 1
    for kwargs, needle in [
        (dict(num_examples=-1, per_rank_batch_size=1), "num_examples=-1"),
        (dict(num_examples=10, per_rank_batch_size=0), "per_rank_batch_size=0"),
        (dict(num_examples=10.0, per_rank_batch_size=2), "num_examples=10.0"),
        (dict(num_examples=True, per_rank_batch_size=2), "num_examples=True"),
    ]:
        with pytest.raises(ValueError, match="Invalid value for argument") as e:
            data.steps_per_epoch(**kwargs)
        assert needle in str(e.value)


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_distribute_dataset_batches_and_steps(drop_remainder):
    ds, steps = data.distribute_dataset(tf.data.Dataset.range(10), global_batch_size=4,
                                        drop_remainder=drop_remainder)
    batches = elements(ds)
    assert steps == len(batches) == (2 if drop_remainder else 3)
    assert batches[:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    if not drop_remainder:
        assert batches[2] == [8, 9]
    assert int(ds.cardinality()) == steps


def test_distribute_dataset_shuffles_with_seed_each_epoch():
    base = tf.data.Dataset.range(20)
    ds, steps = data.distribute_dataset(base, per_rank_batch_size=5, shuffle_buffer=20, seed=3)
    epoch1, epoch2 = sum(elements(ds), []), sum(elements(ds), [])
    assert steps == 4 and sorted(epoch1) == sorted(epoch2) == list(range(20))
    assert epoch1 != list(range(20)) and epoch1 != epoch2
    again, _ = data.distribute_dataset(base, per_rank_batch_size=5, shuffle_buffer=20, seed=3)
    assert sum(elements(again), []) == epoch1


def test_distribute_dataset_structured_elements():
    x, y = np.arange(12, dtype=np.float32).reshape(6, 2), np.arange(6)
    ds, steps = data.distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)),
                                        per_rank_batch_size=2)
    assert steps == 3
    bx, by = next(iter(ds))
    assert bx.shape == (2, 2) and by.numpy().tolist() == [0, 1]


def test_distribute_dataset_unknown_or_infinite_cardinality():
    unknown = tf.data.Dataset.range(10).filter(lambda x: x % 2 == 0)
    with pytest.raises(ValueError, match="this one is unknown") as e:
        data.distribute_dataset(unknown, per_rank_batch_size=2)
    assert "assert_cardinality" in str(e.value) and "steps_per_epoch" in str(e.value)
    with pytest.raises(ValueError, match="this one is infinite"):
        data.distribute_dataset(tf.data.Dataset.range(3).repeat(), per_rank_batch_size=2)
    known = unknown.apply(tf.data.experimental.assert_cardinality(5))
    ds, steps = data.distribute_dataset(known, per_rank_batch_size=2)
    assert steps == 2 and elements(ds) == [[0, 2], [4, 6]]


def test_distribute_dataset_argument_errors():
    ds = tf.data.Dataset.range(10)
    with pytest.raises(ValueError, match="Expected exactly one of"):
        data.distribute_dataset(ds)
    with pytest.raises(ValueError, match="Expected exactly one of"):
        data.distribute_dataset(ds, global_batch_size=2, per_rank_batch_size=2)
    with pytest.raises(ValueError, match="global_batch_size=0"):
        data.distribute_dataset(ds, global_batch_size=0)
    with pytest.raises(ValueError, match="shuffle_buffer=0"):
        data.distribute_dataset(ds, per_rank_batch_size=2, shuffle_buffer=0)
    with pytest.raises(ValueError, match="seed=-1"):
        data.distribute_dataset(ds, per_rank_batch_size=2, shuffle_buffer=4, seed=-1)
    with pytest.raises(ValueError, match="No step per epoch"):
        data.distribute_dataset(ds, per_rank_batch_size=11)
    with pytest.raises(TypeError, match="Received: dataset="):
        data.distribute_dataset(np.arange(4), per_rank_batch_size=2)


def test_check_equal_steps_at_size_one():
    assert data.check_equal_steps(7) == 7
    assert data.check_equal_steps(np.int32(0), name="validation_steps") == 0
    with pytest.raises(ValueError, match="Received: steps=-1"):
        data.check_equal_steps(-1)
    with pytest.raises(ValueError, match="Received: name=''"):
        data.check_equal_steps(1, name="")


def test_shard_files_glob_list_and_shuffle(tmp_path):
    names = [str(tmp_path / f"part-{i}.txt") for i in range(6)]
    for name in names:
        open(name, "w").close()
    assert filenames(data.shard_files(str(tmp_path / "part-*.txt"), shuffle=False)) == names
    assert filenames(data.shard_files(tuple(reversed(names)), shuffle=False)) == names
    shuffled = filenames(data.shard_files(names, seed=1, epoch=0))
    assert sorted(shuffled) == names and shuffled != names
    assert filenames(data.shard_files(names, seed=1, epoch=0)) == shuffled
    assert filenames(data.shard_files(names, seed=1, epoch=1)) != shuffled
    assert filenames(data.shard_files(names, seed=2, epoch=0)) != shuffled


def test_shard_files_errors(tmp_path):
    with pytest.raises(ValueError, match="matches at least one file"):
        data.shard_files(str(tmp_path / "none-*"))
    for bad in ([], [1, 2], None):
        with pytest.raises(ValueError, match="Invalid value for argument `file_pattern_or_list`"):
            data.shard_files(bad)
    with pytest.raises(ValueError, match="seed=-1"):
        data.shard_files(["a"], seed=-1)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
        data.shard_files(["a"], epoch=2**32)


def test_tfds_split_with_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    split = data.tfds_split("train")
    with tfds.testing.mock_data(num_examples=7):
        ds = tfds.load("mnist", split=split)
        assert len(list(ds)) == 7
    with pytest.raises(ValueError, match="Received: split=''"):
        data.tfds_split("")


def test_tfds_split_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r"pip install kerasdist\[tfds\]") as e:
        data.tfds_split()
    assert "importlib_resources" in str(e.value)
