"""uint16, int16 and bool through every collective, against numpy.

uint16 / int16 reduce like the other integers (sums wrap as numpy's do,
averages are exact where the mean fits); bool is moved by allgather,
broadcast and alltoall and reduced by allreduce with Min (logical and) or
Max (logical or); its other reductions fail on every rank with a clear
error, and the engine goes on.
"""

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def data(dtype, r, n):
    rng = np.random.default_rng(r)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, n, endpoint=True).astype(dtype)


def run():
    size, r = kd.size(), kd.rank()
    n = 3001
    for dtype in (np.uint16, np.int16, np.bool_):
        name = np.dtype(dtype).name
        per_rank = [data(dtype, q, n) for q in range(size)]
        x = tf.constant(per_rank[r])
        stack = np.stack(per_rank)
        if dtype != np.bool_:
            wide = stack.astype(np.int64)
            got = kd.allreduce(x, op=kd.Sum, name=f"{name}.sum").numpy()
            np.testing.assert_array_equal(got, wide.sum(0).astype(dtype))  # numpy wraps
            got = kd.allreduce(x, op=kd.Average, name=f"{name}.avg").numpy()
            np.testing.assert_array_equal(got, np.trunc(wide.sum(0) / size).astype(dtype))
        got = kd.allreduce(x, op=kd.Min, name=f"{name}.min").numpy()
        np.testing.assert_array_equal(got, stack.min(0))
        got = kd.allreduce(x, op=kd.Max, name=f"{name}.max").numpy()
        np.testing.assert_array_equal(got, stack.max(0))
        assert got.dtype == dtype
        rows = [per_rank[q][: q + 2] for q in range(size)]
        got = kd.allgather(tf.constant(rows[r]), name=f"{name}.gather").numpy()
        np.testing.assert_array_equal(got, np.concatenate(rows))
        for root in range(size):
            got = kd.broadcast(x, root_rank=root, name=f"{name}.bcast.{root}").numpy()
            np.testing.assert_array_equal(got, per_rank[root])
        splits = [q + 1 for q in range(size)]
        out, received = kd.alltoall(tf.constant(per_rank[r][: sum(splits)]), splits=splits,
                                    name=f"{name}.a2a")
        offset = sum(splits[:r])
        want = np.concatenate([per_rank[q][offset:offset + r + 1] for q in range(size)])
        np.testing.assert_array_equal(out.numpy(), want)
        v = tf.Variable(per_rank[r][:5])
        kd.broadcast_([v], root_rank=size - 1, name=f"{name}.inplace")
        np.testing.assert_array_equal(v.numpy(), per_rank[size - 1][:5])
        log(f"{name} passed")
    for op in (kd.Sum, kd.Average, kd.Product):
        try:
            kd.allreduce(tf.constant([True, False]), op=op, name=f"bool.bad.{op}")
            raise AssertionError("a bool sum did not fail")
        except tf.errors.FailedPreconditionError as e:
            assert "bool tensors are reduced only by allreduce with op Min" in str(e), str(e)
    try:
        kd.reducescatter(tf.constant([True] * size), op=kd.Sum, name="bool.rs")
        raise AssertionError("a bool reducescatter did not fail")
    except tf.errors.FailedPreconditionError as e:
        assert "bool" in str(e), str(e)
    got = kd.allreduce(tf.constant([1], tf.int16), op=kd.Sum, name="after").numpy()
    np.testing.assert_array_equal(got, [size])
    log("extra dtypes passed")


main(run)
