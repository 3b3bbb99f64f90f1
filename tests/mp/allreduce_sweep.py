"""Allreduce of every dtype x op x size against numpy, eager and in a graph."""

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main

DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "int8",
          "uint16", "int16"]
OPS = {kd.Sum: "sum", kd.Average: "average", kd.Min: "min", kd.Max: "max", kd.Product: "product"}


def rank_data(dtype, op, n, r):
    rng = np.random.RandomState(1000 * r + n % 997)
    if op == kd.Product:  # keep products small and exact
        vals = (rng.choice([-1, 1, 2], size=n) if dtype not in ("uint8", "uint16")
                else rng.choice([1, 2], size=n))
    elif dtype == "uint16":  # sums past 65535 wrap, as numpy's
        vals = rng.randint(0, 30000, size=n)
    elif dtype == "int16":  # and past +-32767
        vals = rng.randint(-12000, 12000, size=n)
    elif dtype in ("uint8",):
        vals = rng.randint(0, 60, size=n)
    elif dtype in ("int8",):
        vals = rng.randint(-30, 30, size=n)
    elif dtype.startswith("int"):
        vals = rng.randint(-1000, 1000, size=n)
    else:
        vals = rng.randint(-64, 64, size=n) / 4.0  # exact in every float type
    return vals


def expected(dtype, op, n, size):
    stack = np.stack([rank_data(dtype, op, n, r).astype(np.float64) for r in range(size)])
    if op == kd.Sum:
        ref = stack.sum(0)
    elif op == kd.Average:
        ref = stack.sum(0) / size
        if dtype in ("int32", "int64", "uint8", "int8", "uint16", "int16"):
            ref = np.trunc(ref)
    elif op == kd.Min:
        ref = stack.min(0)
    elif op == kd.Max:
        ref = stack.max(0)
    else:
        ref = stack.prod(0)
    if dtype == "uint8":
        ref = np.mod(ref, 256)
    if dtype == "int8":
        ref = (ref + 128) % 256 - 128
    if dtype == "uint16":
        ref = np.mod(ref, 65536)
    if dtype == "int16":
        ref = (ref + 32768) % 65536 - 32768
    return ref


def tol(dtype, op, size):
    if dtype == "float16":
        return 1e-2
    if dtype == "bfloat16":
        return 5e-2
    return 1e-6


def run():
    size, r = kd.size(), kd.rank()
    # 1000 takes the small-buffer path; 50001 (odd, > 32 KiB in every dtype)
    # the ring, where each rank finishes (averages) only its own chunk.
    sizes = sorted({0, 1, size - 1, size + 1, 1000, 50001, 1 << 20})
    checked = 0
    for dtype in DTYPES:
        tfd = tf.as_dtype(dtype)
        for op, opname in OPS.items():
            for n in sizes:
                if n == 1 << 20 and op != kd.Sum and dtype not in ("float32",):
                    continue  # the big size once per dtype (sum) and all ops for float32
                if n == 50001 and op not in (kd.Sum, kd.Average):
                    continue
                x = tf.cast(tf.constant(rank_data(dtype, op, n, r), tf.float64), tfd)
                y = kd.allreduce(x, op=op, name=f"{dtype}.{opname}.{n}")
                assert y.dtype == tfd and y.shape == x.shape, (y.dtype, y.shape)
                got = tf.cast(y, tf.float64).numpy()
                ref = expected(dtype, op, n, size)
                if not np.allclose(got, ref, rtol=tol(dtype, op, size), atol=tol(dtype, op, size)):
                    bad = np.argmax(np.abs(got - ref))
                    raise AssertionError(f"{dtype} {opname} n={n}: got {got[bad]} want {ref[bad]} at {bad}")
                checked += 1
    # Prescale/postscale and the same collectives inside a tf.function.
    @tf.function
    def scaled(a):
        return kd.allreduce(a, op=kd.Sum, prescale_factor=2.0, postscale_factor=0.5, name="scaled")

    a = tf.fill([17], float(r + 1))
    np.testing.assert_allclose(scaled(a).numpy(), np.full(17, sum(range(1, size + 1)), np.float32))
    avg = kd.allreduce(tf.fill([5], float(r)), op=kd.Average, postscale_factor=3.0)
    np.testing.assert_allclose(avg.numpy(), np.full(5, 3.0 * (size - 1) / 2.0))
    # The same on the ring (the owner of each chunk scales it), and a group
    # mixing tensors at KERASDIST_FUSION_TENSOR_LIMIT (1 MiB: planned alone,
    # reduced from input to output) with small ones that fuse around them.
    big = kd.allreduce(tf.fill([300001], float(r)), op=kd.Average, postscale_factor=3.0)
    np.testing.assert_array_equal(big.numpy(), np.full(300001, 3.0 * (size - 1) / 2.0, np.float32))
    shapes = [[5], [262144], [7], [3, 100000], [1]]
    group = [tf.constant(np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) * (r + 1))
             for s in shapes]
    for op, scale in ((kd.Sum, sum(range(1, size + 1))), (kd.Average, sum(range(1, size + 1)) / size)):
        out = kd.grouped_allreduce(group, op=op, name=f"mixed.{op}")
        for s, t in zip(shapes, out):
            want = np.arange(int(np.prod(s)), dtype=np.float64).reshape(s) * scale
            np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)
        # Replicas are bit-identical.
        gathered = kd.allgather(tf.concat([tf.reshape(t, [1, -1]) for t in out], 1))
        for k in range(1, size):
            np.testing.assert_array_equal(gathered[k].numpy(), gathered[0].numpy())
    log(f"checked {checked} allreduce cases at size {size}")


main(run)
