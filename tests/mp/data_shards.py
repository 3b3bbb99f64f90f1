"""kerasdist.data across ranks: disjoint shards, equal steps, file sharding,
errors raised on every rank, and (if installed) TFDS splits, all in one
launch. Usage: data_shards.py TMP_DIR"""

import os
import sys

import tensorflow as tf

import kerasdist as kd
from _util import log, main
from data_tfds import check_tfds
from kerasdist import data


def gather(obj, name):
    return kd.allgather_object(obj, name=name)


def expect_value_error(fn, *needles):
    try:
        fn()
    except ValueError as e:
        for needle in needles:
            assert needle in str(e), (needle, str(e))
        return str(e)
    raise AssertionError("expected a ValueError")


def check_shard(size):
    for n in (10, 11, 12):
        mine = [int(x) for x in data.shard(tf.data.Dataset.range(n))]
        parts = gather(mine, f"shard.{n}")
        union = sorted(sum(parts, []))
        assert union == list(range(n)), (n, parts)  # disjoint and complete
        assert max(map(len, parts)) - min(map(len, parts)) <= 1, parts


def check_distribute(size, r):
    for n in (10, 11, 12):
        for drop in (True, False):
            for kwargs in (dict(per_rank_batch_size=2), dict(global_batch_size=2 * size),
                           dict(per_rank_batch_size=3, shuffle_buffer=8, seed=r)):
                tag = f"dist.{n}.{drop}.{sorted(kwargs)}"
                ds, steps = data.distribute_dataset(tf.data.Dataset.range(n),
                                                    drop_remainder=drop, **kwargs)
                batch = kwargs.get("per_rank_batch_size", 2)
                assert steps == data.steps_per_epoch(n, batch, drop), (tag, steps)
                batches = [[int(x) for x in b] for b in ds]
                counts = gather((steps, len(batches)), tag + ".count")
                assert len(set(counts)) == 1 and counts[0][0] == counts[0][1], (tag, counts)
                seen = sum(gather(sum(batches, []), tag + ".elems"), [])
                assert len(seen) == len(set(seen)), (tag, "not disjoint", seen)
                per_rank = n // size
                want = steps * batch if drop else per_rank
                assert len(seen) == want * size, (tag, len(seen), want)
                # A second epoch gives the same number of batches.
                assert sum(1 for _ in ds) == steps, tag
    expect_value_error(lambda: data.distribute_dataset(tf.data.Dataset.range(12),
                                                       global_batch_size=2 * size + 1),
                       f"multiple of the number of ranks ({size})")


def check_steps_errors(size, r):
    msg = expect_value_error(lambda: data.check_equal_steps(10 + (r == 1)),
                             "different `steps_per_epoch`", "rank 0: 10", "rank 1: 11")
    log("check_equal_steps:", msg[:120])
    expect_value_error(lambda: data.check_equal_steps(5 if r == size - 1 else 4, name="val"),
                       "different `val`", f"rank {size - 1}: 5")
    # Different datasets per rank: the cardinality check fails everywhere.
    expect_value_error(lambda: data.distribute_dataset(tf.data.Dataset.range(10 + r),
                                                       per_rank_batch_size=1),
                       "different cardinalities", "rank 1: 11")
    # Different batch sizes per rank: the step check fails everywhere.
    expect_value_error(lambda: data.distribute_dataset(tf.data.Dataset.range(30),
                                                       per_rank_batch_size=1 + r),
                       "different `distribute_dataset.steps_per_epoch`")
    expect_value_error(lambda: data.distribute_dataset(
        tf.data.Dataset.range(10).filter(lambda x: x > 2), per_rank_batch_size=1),
        "unknown", "assert_cardinality")
    steps = gather(data.steps_per_epoch(11, 2), "spe")
    assert steps == [11 // size // 2] * size, steps
    # The engine still works after the errors.
    kd.barrier(name="data.after_errors")


def check_files(size, r, tmp_root):
    path = None
    if r == 0:
        path = os.path.join(tmp_root, "files")
        os.makedirs(path, exist_ok=True)
        for i in range(5):
            with open(os.path.join(path, f"part-{i}.txt"), "w") as f:
                f.write("".join(f"{i}-{j}\n" for j in range(i + 1)))
    path = kd.broadcast_object(path, root_rank=0, name="files.path")
    kd.barrier(name="files.ready")
    pattern = os.path.join(path, "part-*.txt")
    all_files = sorted(os.path.join(path, f"part-{i}.txt") for i in range(5))
    for shuffle in (False, True):
        orders = []
        for epoch in (0, 1):
            mine = [f.decode() for f in data.shard_files(pattern, shuffle=shuffle, seed=7,
                                                         epoch=epoch).as_numpy_iterator()]
            parts = gather(mine, f"files.{shuffle}.{epoch}")
            assert sorted(sum(parts, [])) == all_files, parts
            assert [len(p) for p in parts] == [len(all_files[k::size]) for k in range(size)]
            if not shuffle:
                assert parts == [all_files[k::size] for k in range(size)], parts
            orders.append(parts)
            # The files really are read: the ranks' lines add up to all lines.
            lines = data.shard_files(pattern, shuffle=shuffle, seed=7, epoch=epoch).interleave(
                tf.data.TextLineDataset, cycle_length=2)
            n_lines = sum(gather(sum(1 for _ in lines), f"lines.{shuffle}.{epoch}"))
            assert n_lines == 1 + 2 + 3 + 4 + 5, n_lines
        if shuffle:
            assert orders[0] != orders[1], orders  # a new epoch deals files anew
    msg = expect_value_error(lambda: data.shard_files(all_files[: 4 + (r == 0)]),
                             "different file lists", "rank 0: 5 files", "rank 1: 4 files")
    log("shard_files mismatch:", msg[:120])
    expect_value_error(lambda: data.shard_files(all_files[: size - 1]),
                       "at least as many files as ranks",
                       f"{size - 1} files for {size} ranks")


def run():
    size, r = kd.size(), kd.rank()
    assert size > 1, "run under mpiexec with at least 2 ranks"
    check_shard(size)
    check_distribute(size, r)
    check_steps_errors(size, r)
    check_files(size, r, sys.argv[1])
    check_tfds(size, r, sys.argv[1])


main(run)
