"""reducescatter / grouped_reducescatter against numpy: every dtype, Sum and
Average, Horovod's uneven row split, 0-row tensors, fusion, scale factors,
gradients (eager and tf.function) and kerasdist.keras.reducescatter."""

import numpy as np
import tensorflow as tf

import kerasdist as kd
import kerasdist.keras as hvdk
from _util import log, main

DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "int8"]
INTS = ("int32", "int64", "uint8", "int8")


def rank_data(dtype, shape, r, salt=0):
    rng = np.random.RandomState(7919 * r + 31 * int(np.prod(shape)) + salt)
    n = int(np.prod(shape))
    if dtype == "uint8":
        vals = rng.randint(0, 80, size=n)
    elif dtype == "int8":
        vals = rng.randint(-40, 40, size=n)
    elif dtype in INTS:
        vals = rng.randint(-1000, 1000, size=n)
    else:
        vals = rng.randint(-64, 64, size=n) / 4.0  # exact in every float type
    return vals.reshape(shape)


def horovod_rows(dim0, size, rank):
    """Horovod's split: dim0 // size rows each, one more for the first dim0 % size."""
    q, rem = divmod(dim0, size)
    start = rank * q + min(rank, rem)
    return start, start + q + (1 if rank < rem else 0)


def expected(dtype, op, shape, size, rank, pre=1.0, post=1.0, salt=0):
    stack = np.stack([rank_data(dtype, shape, k, salt).astype(np.float64) * pre
                      for k in range(size)])
    ref = stack.sum(0)
    if op == kd.Average:
        ref = ref / size
        if dtype in INTS:
            ref = np.trunc(ref)
    ref = ref * post
    if dtype in INTS:
        ref = np.trunc(ref)
    start, stop = horovod_rows(shape[0], size, rank)
    return ref[start:stop]


def tol(dtype):
    return {"float16": 1e-2, "bfloat16": 5e-2}.get(dtype, 1e-6)


def check(got, dtype, want):
    assert got.dtype == tf.as_dtype(dtype), (got.dtype, dtype)
    assert tuple(got.shape) == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(tf.cast(got, tf.float64).numpy(), want,
                               rtol=tol(dtype), atol=tol(dtype))


def check_every_dtype_op_and_split(size, r):
    dims = sorted({0, 1, size - 1, size + 1, 2 * size, 7, 1000})
    for dtype in DTYPES:
        for op in (kd.Sum, kd.Average):
            for d in dims:
                for trailing in ((), (3,)):
                    shape = (d,) + trailing
                    x = tf.constant(rank_data(dtype, shape, r), dtype=dtype)
                    y = kd.reducescatter(x, op=op, name=f"rs.{dtype}.{op}.{d}.{len(trailing)}")
                    check(y, dtype, expected(dtype, op, shape, size, r))
    # Many segments (the default segment is 256 KiB) with an uneven split.
    shape = (300001, 1)
    y = kd.reducescatter(tf.constant(rank_data("float32", shape, r), tf.float32),
                         op=kd.Sum, name="rs.large")
    check(y, "float32", expected("float32", kd.Sum, shape, size, r))
    # Rows of zero elements.
    y = kd.reducescatter(tf.zeros([5, 0]), name="rs.empty_rows")
    assert tuple(y.shape) == (horovod_rows(5, size, r)[1] - horovod_rows(5, size, r)[0], 0)


def check_scale_factors_and_default_op(size, r):
    for dtype in ("float32", "int32"):
        x = tf.constant(rank_data(dtype, (9, 2), r), dtype=dtype)
        y = kd.reducescatter(x, op=kd.Sum, prescale_factor=2.0, postscale_factor=0.5,
                             name=f"rs.scaled.{dtype}")
        check(y, dtype, expected(dtype, kd.Sum, (9, 2), size, r, pre=2.0, post=0.5))
    x = tf.constant(rank_data("float64", (4,), r))
    check(kd.reducescatter(x, name="rs.default"), "float64",
          expected("float64", kd.Average, (4,), size, r))
    check(kd.reducescatter(x, op=None, name="rs.none"), "float64",
          expected("float64", kd.Average, (4,), size, r))


def check_grouped_is_fused_and_exact(size, r):
    specs = [("float32", (5, 2)), ("float32", (size,)), ("int8", (3, 3)),
             ("float64", (0, 4)), ("float32", (1,)), ("bfloat16", (2 * size + 1,))]
    for op in (kd.Sum, kd.Average):
        xs = [tf.constant(rank_data(d, s, r, salt=i), dtype=d) for i, (d, s) in enumerate(specs)]
        ys = kd.grouped_reducescatter(xs, op=op, name=f"grs.{op}")
        for i, ((d, s), y) in enumerate(zip(specs, ys)):
            check(y, d, expected(d, op, s, size, r, salt=i))

    @tf.function
    def step(a, b):
        return kd.grouped_reducescatter([a, b], op=kd.Sum)

    for _ in range(2):
        a = tf.constant(rank_data("float32", (7, 2), r), tf.float32)
        b = tf.constant(rank_data("int64", (size + 2,), r), tf.int64)
        ya, yb = step(a, b)
        check(ya, "float32", expected("float32", kd.Sum, (7, 2), size, r))
        check(yb, "int64", expected("int64", kd.Sum, (size + 2,), size, r))
    assert kd.grouped_reducescatter([]) == []


def check_in_tf_function(size, r):
    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def scatter(t):
        return kd.reducescatter(t, op=kd.Sum, name="rs.fn")

    for d in (0, 3, 2 * size + 1):
        y = scatter(tf.constant(rank_data("float32", (d, 2), r), tf.float32))
        check(y, "float32", expected("float32", kd.Sum, (d, 2), size, r))
    assert scatter.get_concrete_function().structured_outputs.shape.as_list() == [None, 2]


def gradient_want(op, d, size, r, scale=1.0):
    """Horovod's gradient: the allgathered upstream gradient, times size for Sum.
    Upstream on rank k is (k + 1) on each of its rows."""
    rows = [horovod_rows(d, size, k) for k in range(size)]
    g = np.concatenate([np.full([b - a, 2], k + 1.0) for k, (a, b) in enumerate(rows)])
    return g * (size if op == kd.Sum else 1) * scale


def check_gradients(size, r):
    d = 2 * size + 1
    for op in (kd.Sum, kd.Average):
        x = tf.Variable(tf.constant(rank_data("float32", (d, 2), r), tf.float32))
        with tf.GradientTape() as tape:
            y = kd.reducescatter(x, op=op, name=f"rs.grad.{op}")
            loss = tf.reduce_sum(y * float(r + 1))
        np.testing.assert_allclose(tape.gradient(loss, x).numpy(), gradient_want(op, d, size, r))

    @tf.function
    def grads(x, a):
        with tf.GradientTape() as tape:
            ys = kd.grouped_reducescatter([x, a], op=kd.Sum, prescale_factor=3.0)
            loss = tf.reduce_sum(ys[0]) * float(r + 1)  # ys[1] unused: None upstream
        return tape.gradient(loss, [x, a])

    x = tf.Variable(tf.zeros([d, 2]))
    a = tf.Variable(tf.zeros([size, 2]))
    gx, ga = grads(x, a)
    np.testing.assert_allclose(gx.numpy(), gradient_want(kd.Sum, d, size, r, scale=3.0))
    np.testing.assert_allclose(ga.numpy(), np.zeros([size, 2]))


def check_keras_module(size, r):
    x = rank_data("float32", (size + 1, 2), r).astype(np.float32)
    y = hvdk.reducescatter(x, op=hvdk.Sum, name="rs.keras")
    assert isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, expected("float32", kd.Sum, (size + 1, 2), size, r))


def run():
    size, r = kd.size(), kd.rank()
    for c in (check_every_dtype_op_and_split, check_scale_factors_and_default_op,
              check_grouped_is_fused_and_exact, check_in_tf_function, check_gradients,
              check_keras_module):
        c(size, r)
        log(c.__name__, "passed")


main(run)
