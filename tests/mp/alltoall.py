"""alltoall against numpy (every dtype, uneven and zero-size splits, 0-row
tensors, the default even split, Horovod's return convention), its gradient
(eager and tf.function), grouped_allgather and broadcast_."""

import keras
import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main

DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "int8"]


def splits_of(i, size, pattern):
    """Rows rank i sends to each rank."""
    if pattern == "uneven":  # includes zero-size splits
        return [(i + 2 * j) % 3 for j in range(size)]
    if pattern == "rank0_empty":  # rank 0 sends nothing at all (a 0-row tensor)
        return [0 if i == 0 else j + 1 for j in range(size)]
    if pattern == "large":
        return [40000 + 1000 * j + 7 * i for j in range(size)]
    raise ValueError(pattern)


def rank_rows(i, rows, width, dtype):
    # Row values encode (sender, row): every row that arrives is identifiable.
    vals = (np.arange(rows * width).reshape(rows, width) % 20) + 20 * i
    return vals.astype(np.float64).astype(dtype) if dtype != "bfloat16" else vals


def expected(size, r, pattern, width, dtype):
    parts = []
    for i in range(size):
        s = splits_of(i, size, pattern)
        data = rank_rows(i, sum(s), width, dtype).astype(np.float64)
        start = sum(s[:r])
        parts.append(data[start:start + s[r]])
    return np.concatenate(parts), [splits_of(i, size, pattern)[r] for i in range(size)]


def check_every_dtype_and_split(size, r):
    for dtype in DTYPES:
        for pattern in ("uneven", "rank0_empty"):
            s = splits_of(r, size, pattern)
            x = tf.constant(rank_rows(r, sum(s), 3, dtype), dtype=dtype)
            out, received = kd.alltoall(x, splits=s, name=f"a2a.{dtype}.{pattern}")
            want, want_received = expected(size, r, pattern, 3, dtype)
            assert out.dtype == x.dtype and received.dtype == tf.int32
            assert out.shape == want.shape, (out.shape, want.shape)
            np.testing.assert_array_equal(tf.cast(out, tf.float64).numpy(), want)
            assert received.numpy().tolist() == want_received, received
    # Many segments per peer; splits as an int64 tensor.
    s = splits_of(r, size, "large")
    x = tf.constant(rank_rows(r, sum(s), 2, "float32"))
    out, received = kd.alltoall(x, splits=tf.constant(s, tf.int64), name="a2a.large")
    want, want_received = expected(size, r, "large", 2, "float32")
    np.testing.assert_array_equal(out.numpy(), want)
    assert received.numpy().tolist() == want_received


def check_default_split_and_return_convention(size, r):
    # Without splits Horovod returns the tensor alone and splits evenly.
    x = tf.reshape(tf.range(2 * size * 2) + 100 * r, [2 * size, 2])
    out = kd.alltoall(x, name="a2a.even")
    assert isinstance(out, tf.Tensor)
    want = np.concatenate([np.arange(2 * size * 2).reshape(2 * size, 2)[2 * r:2 * r + 2] + 100 * k
                           for k in range(size)])
    np.testing.assert_array_equal(out.numpy(), want)
    # Everything empty, and a 1-D tensor.
    out, received = kd.alltoall(tf.zeros([0]), splits=[0] * size, name="a2a.nothing")
    assert out.shape == (0,) and received.numpy().tolist() == [0] * size
    out = kd.alltoall(tf.zeros([0, 4], tf.int8), name="a2a.nothing_even")
    assert out.shape == (0, 4)


def check_in_tf_function(size, r):
    @tf.function
    def exchange(x, s):
        return kd.alltoall(x, splits=s)

    for pattern in ("uneven", "rank0_empty"):
        s = splits_of(r, size, pattern)
        out, received = exchange(tf.constant(rank_rows(r, sum(s), 3, "float32")), tf.constant(s))
        want, want_received = expected(size, r, pattern, 3, "float32")
        np.testing.assert_array_equal(out.numpy(), want)
        assert received.numpy().tolist() == want_received


def alltoall_grad_want(size, r, pattern, scale):
    """d/dx of sum(weights_j * y_j) over ranks j: the weight at the place each
    row of x landed. weights_j = 10 * j + row index on rank j."""
    grad = []
    s = splits_of(r, size, pattern)
    for j in range(size):
        rows_j = sum(splits_of(i, size, pattern)[j] for i in range(size))
        w_j = np.repeat((10.0 * j + np.arange(rows_j))[:, None], 2, axis=1)
        start = sum(splits_of(i, size, pattern)[j] for i in range(r))
        grad.append(w_j[start:start + s[j]])
    return np.concatenate(grad) * scale


def check_gradients(size, r):
    for pattern in ("uneven", "rank0_empty"):
        s = splits_of(r, size, pattern)
        x = tf.Variable(tf.ones([sum(s), 2]))

        def loss_of(x):
            y, _ = kd.alltoall(x * 3.0, splits=s)
            w = 10.0 * r + tf.range(tf.shape(y)[0], dtype=tf.float32)
            return tf.reduce_sum(y * w[:, None])

        with tf.GradientTape() as tape:
            loss = loss_of(x)
        np.testing.assert_array_equal(tape.gradient(loss, x).numpy(),
                                      alltoall_grad_want(size, r, pattern, 3.0))

        @tf.function
        def graph_grad():
            with tf.GradientTape() as t:
                loss = loss_of(x)
            return t.gradient(loss, x)

        np.testing.assert_array_equal(graph_grad().numpy(),
                                      alltoall_grad_want(size, r, pattern, 3.0))


def check_grouped_allgather(size, r):
    xs = [tf.fill([r + 1, 2], float(r)), tf.constant([r] * r, tf.int64),
          tf.cast(tf.fill([2, 3], r), tf.int8)]
    ys = kd.grouped_allgather(xs, name="gag")
    np.testing.assert_array_equal(ys[0].numpy(),
                                  np.concatenate([np.full([k + 1, 2], k) for k in range(size)]))
    assert ys[1].numpy().tolist() == [k for k in range(size) for _ in range(k)]
    assert ys[2].dtype == tf.int8 and ys[2].shape == (2 * size, 3)
    assert kd.grouped_allgather([]) == []

    # Gradient: as allgather's, the average over ranks of the upstream
    # gradient, this rank's slice of it.
    a = tf.Variable(tf.ones([r + 1, 2]))
    b = tf.Variable(tf.ones([2]))

    @tf.function
    def grads():
        with tf.GradientTape() as tape:
            ga, _ = kd.grouped_allgather([a, b])
            loss = tf.reduce_sum(ga * float(r + 1))  # b's output unused
        return tape.gradient(loss, [a, b])

    da, db = grads()
    np.testing.assert_allclose(da.numpy(), np.full([r + 1, 2], (size + 1) / 2.0))
    np.testing.assert_allclose(db.numpy(), np.zeros([2]))


def check_broadcast_inplace(size, r):
    root = size - 1
    v = tf.Variable(tf.fill([3, 4], float(r)))
    before = v.read_value()  # aliases the buffer: must keep its value
    handle = v.handle
    out = kd.broadcast_([v], root_rank=root)
    np.testing.assert_array_equal(v.numpy(), np.full([3, 4], float(root)))
    np.testing.assert_array_equal(out[0].numpy(), np.full([3, 4], float(root)))
    np.testing.assert_array_equal(before.numpy(), np.full([3, 4], float(r)))
    assert v.handle is handle
    kv = keras.Variable(np.full([2], r, np.int8), dtype="int8")
    half = tf.Variable(tf.fill([5], tf.constant(r, tf.float16)))
    bf = tf.Variable(tf.cast(tf.fill([0, 2], r), tf.bfloat16))
    kd.broadcast_([kv, half, bf], 0, name="bc_.mixed")
    assert kv.numpy().tolist() == [0, 0] and half.numpy().tolist() == [0.0] * 5

    w = tf.Variable(tf.fill([6], float(r) * 2))

    @tf.function
    def sync():
        got = kd.broadcast_([w], root_rank=root)
        return got[0] + 1.0

    np.testing.assert_array_equal(sync().numpy(), np.full([6], 2.0 * root + 1))
    np.testing.assert_array_equal(w.numpy(), np.full([6], 2.0 * root))
    for bad in (lambda: kd.broadcast_([v], root_rank=size), lambda: kd.broadcast_([tf.ones([2])], 0)):
        try:
            bad()
            raise AssertionError("expected an error")
        except (ValueError, TypeError):
            pass


def run():
    size, r = kd.size(), kd.rank()
    for c in (check_every_dtype_and_split, check_default_split_and_return_convention,
              check_in_tf_function, check_gradients, check_grouped_allgather,
              check_broadcast_inplace):
        c(size, r)
        log(c.__name__, "passed")


main(run)
