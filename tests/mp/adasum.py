"""op=kerasdist.Adasum against a numpy model of the adaptive-sum tree.

Adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b, per tensor,
combined over a binary tree of ranks (rank r with r ^ 1, then r ^ 2, ...;
the lower rank's vector first). Run on a power-of-two number of ranks it
checks values, fused groups, dtypes, bit-identical replicas, errors and a
`fit` with `DistributedOptimizer(op=Adasum)`; with `nonpow2` on any other
number it checks the error on every rank.
"""

import sys

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def combine(a, b):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    dot, aa, bb = np.dot(a64, b64), np.dot(a64, a64), np.dot(b64, b64)
    ca = 1.0 - dot / (2 * aa) if aa > 0 else 1.0
    cb = 1.0 - dot / (2 * bb) if bb > 0 else 1.0
    return ca * a64 + cb * b64


def reference(vectors, round_to):
    """Every rank's result of the tree, rounded to the element type after
    each level as the engine does."""
    vs = [round_to(v.astype(np.float64)) for v in vectors]
    n, mask = len(vs), 1
    while mask < n:
        vs = [round_to(combine(vs[min(r, r ^ mask)], vs[max(r, r ^ mask)]))
              for r in range(n)]
        mask <<= 1
    return vs[0]


def rounder(dtype):
    if dtype == tf.bfloat16:
        return lambda v: tf.cast(tf.cast(v, tf.float32), tf.bfloat16).numpy().astype(np.float64)
    return lambda v: v.astype(dtype.as_numpy_dtype).astype(np.float64)


def inputs(n, seed_offset=0):
    """Correlated vectors (a common part plus each rank's own), so that the
    adaptive sum is far from both the sum and the average."""
    common = np.random.default_rng(1000 + seed_offset).standard_normal(n)
    return [common + 0.7 * np.random.default_rng(r + seed_offset).standard_normal(n)
            for r in range(kd.size())]


def same_on_every_rank(t, what):
    bits = tf.reshape(tf.bitcast(tf.reshape(t, [-1]), tf.uint8), [1, -1])
    gathered = kd.allgather(bits, name=f"bits.{what}").numpy()
    for r in range(1, kd.size()):
        assert np.array_equal(gathered[0], gathered[r]), f"{what}: rank {r} differs from rank 0"


def check_values():
    size, r = kd.size(), kd.rank()
    tol = {tf.float64: 1e-12, tf.float32: 2e-6, tf.float16: 4e-3, tf.bfloat16: 3e-2}
    for dtype in (tf.float32, tf.float64, tf.float16, tf.bfloat16):
        for n in (1, 17, 70001):
            vecs = inputs(n)
            x = tf.constant(vecs[r], dtype)
            got = kd.allreduce(x, op=kd.Adasum, name=f"ada.{dtype.name}.{n}")
            assert got.dtype == dtype and got.shape == x.shape
            want = reference(vecs, rounder(dtype))
            g = tf.cast(got, tf.float64).numpy()
            scale = np.abs(want).max()
            np.testing.assert_allclose(g, want, rtol=tol[dtype], atol=tol[dtype] * scale,
                                       err_msg=f"{dtype.name} n={n}")
            same_on_every_rank(got, f"{dtype.name}.{n}")
            if n > 1:
                # Neither the sum nor the average of the correlated inputs.
                total = np.sum(vecs, axis=0)
                assert np.abs(g - total).max() > 0.05 * scale, "Adasum gave the sum"
                assert np.abs(g - total / size).max() > 0.05 * scale, "Adasum gave the mean"
    log("values match the numpy tree for float32/64/16 and bfloat16")


def check_exact_cases():
    size, r = kd.size(), kd.rank()
    # Identical vectors on every rank: the result is that vector, exactly.
    a = np.linspace(-3, 5, 1000).astype(np.float32)
    got = kd.allreduce(tf.constant(a), op=kd.Adasum, name="ada.same").numpy()
    np.testing.assert_array_equal(got, a)
    # Orthogonal vectors: the sum, exactly.
    e = np.zeros(size, np.float32)
    e[r] = r + 1.0
    got = kd.allreduce(tf.constant(e), op=kd.Adasum, name="ada.orth").numpy()
    np.testing.assert_array_equal(got, np.arange(1, size + 1, dtype=np.float32))
    # A rank with a zero gradient leaves the others' combination unchanged.
    vecs = inputs(513, 7)
    vecs[size - 1] = np.zeros(513)
    got = kd.allreduce(tf.constant(vecs[r]), op=kd.Adasum, name="ada.zero").numpy()
    np.testing.assert_allclose(got, reference(vecs, rounder(tf.float64)), rtol=1e-12)
    # Parallel vectors (r + 1) * a: the numpy tree in float64, to rounding.
    vecs = [(k + 1) * a.astype(np.float64) for k in range(size)]
    got = kd.allreduce(tf.constant(vecs[r]), op=kd.Adasum, name="ada.parallel").numpy()
    np.testing.assert_allclose(got, reference(vecs, rounder(tf.float64)), rtol=1e-13)
    if size == 2:  # Adasum(a, 2a) = 0 * a + 0.75 * 2a
        np.testing.assert_allclose(got, 1.5 * a.astype(np.float64), rtol=1e-13)
    log("exact cases passed")


def check_grouped_and_graph():
    size, r = kd.size(), kd.rank()
    # Per tensor: t0 is the same everywhere (-> t0), t1 orthogonal (-> sum).
    # One dot product over the fused buffer would give neither.
    t0 = np.linspace(1, 2, 300)
    t1 = np.zeros(size * 10)
    t1[r * 10:(r + 1) * 10] = 2.0
    outs = kd.grouped_allreduce([tf.constant(t0), tf.constant(t1)], op=kd.Adasum,
                                name="ada.grouped")
    np.testing.assert_array_equal(outs[0].numpy(), t0)
    np.testing.assert_array_equal(outs[1].numpy(), np.full(size * 10, 2.0))
    # Separate allreduces inside one tf.function are fused by the engine;
    # they must still be reduced tensor by tensor.
    vecs0, vecs1 = inputs(1000, 11), inputs(333, 12)

    @tf.function
    def step(x0, x1):
        return (kd.allreduce(x0, op=kd.Adasum, name="ada.fn0"),
                kd.allreduce(x1, op=kd.Adasum, name="ada.fn1"))

    for _ in range(2):
        g0, g1 = step(tf.constant(vecs0[r], tf.float32), tf.constant(vecs1[r], tf.float32))
        np.testing.assert_allclose(g0.numpy(), reference(vecs0, rounder(tf.float32)),
                                   rtol=2e-6, atol=1e-5)
        np.testing.assert_allclose(g1.numpy(), reference(vecs1, rounder(tf.float32)),
                                   rtol=2e-6, atol=1e-5)
    # Scale factors apply before and after the tree (it is scale-equivariant).
    got = kd.allreduce(tf.constant(vecs0[r]), op=kd.Adasum, prescale_factor=0.5,
                       postscale_factor=4.0, name="ada.scaled").numpy()
    np.testing.assert_allclose(got, 2.0 * reference(vecs0, rounder(tf.float64)), rtol=1e-12)
    log("grouped, fused and tf.function cases passed")


def check_errors():
    r = kd.rank()
    try:
        kd.allreduce(tf.ones([3], tf.int32), op=kd.Adasum, name="ada.int")
        raise AssertionError("integer Adasum did not fail")
    except tf.errors.FailedPreconditionError as e:
        assert "floating-point" in str(e) and "int32" in str(e), str(e)
    sparse = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 1]), tf.constant([4, 3]))
    try:
        kd.allreduce(sparse, op=kd.Adasum, name="ada.sparse")
        raise AssertionError("sparse Adasum did not fail")
    except NotImplementedError as e:
        assert "sparse_as_dense" in str(e), str(e)
    dense = kd.allreduce(sparse, op=kd.Adasum, sparse_as_dense=True, name="ada.dense").numpy()
    np.testing.assert_array_equal(dense[:2], np.ones([2, 3], np.float32))
    out = kd.allreduce(tf.fill([4], float(r)), op=kd.Sum, name="ada.after")
    np.testing.assert_array_equal(out.numpy(), np.full(4, sum(range(kd.size())), np.float32))
    log("errors passed")


def check_fit():
    import keras

    r = kd.rank()
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    opt = kd.DistributedOptimizer(keras.optimizers.SGD(0.01), op=kd.Adasum)
    model.compile(optimizer=opt, loss="mse")
    rng = np.random.default_rng(100 + r)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[kd.callbacks.BroadcastGlobalVariablesCallback(0)])
    after = model.get_weights()
    assert any(np.abs(a - b).max() > 0 for a, b in zip(after, before)), "no update"
    for i, w in enumerate(after):
        same_on_every_rank(tf.constant(w), f"weight{i}")
    log("fit with DistributedOptimizer(op=Adasum) keeps replicas bit-identical")


def run_nonpow2():
    r = kd.rank()
    try:
        kd.allreduce(tf.ones([3]), op=kd.Adasum, name="ada.np")
        raise AssertionError("Adasum on a non-power-of-two size did not fail")
    except tf.errors.FailedPreconditionError as e:
        msg = str(e)
        assert "power-of-two" in msg and f"size={kd.size()}" in msg, msg
    out = kd.allreduce(tf.fill([4], float(r)), op=kd.Sum, name="ada.np.after")
    np.testing.assert_array_equal(out.numpy(), np.full(4, sum(range(kd.size())), np.float32))
    log("non-power-of-two error passed")


def run():
    if sys.argv[1:] == ["nonpow2"]:
        run_nonpow2()
        return
    check_values()
    check_exact_cases()
    check_grouped_and_graph()
    check_errors()
    check_fit()
    log("adasum checks passed")


main(run)
