"""Broadcast, ragged allgather, ordering, fusion, objects and gradients."""

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def check_broadcast(size, r):
    for root in range(size):
        for dtype in (tf.float32, tf.int64, tf.float16, tf.uint8):
            for n in (0, 1, 1000, 300000):
                x = tf.cast(tf.fill([n], r * 10 + 1), dtype)
                y = kd.broadcast(x, root_rank=root, name=f"bc.{root}.{dtype.name}.{n}")
                np.testing.assert_array_equal(y.numpy(), np.full(n, root * 10 + 1))
    v = tf.Variable(tf.fill([3, 4], float(r)))
    kd.broadcast_variables([v], root_rank=size - 1)
    np.testing.assert_array_equal(v.numpy(), np.full([3, 4], size - 1.0))


def check_allgather(size, r):
    for dtype in (tf.float32, tf.int32, tf.bfloat16, tf.int8):
        # Ragged first dimension: rank k sends k+1 rows (rank 0 may send 0).
        for base in (0, 1, 5000):
            rows = base + r
            x = tf.cast(tf.fill([rows, 3], r), dtype)
            y = kd.allgather(x, name=f"ag.{dtype.name}.{base}")
            want = np.concatenate([np.full([base + k, 3], k) for k in range(size)])
            assert y.shape == want.shape, (y.shape, want.shape)
            np.testing.assert_array_equal(tf.cast(y, tf.float64).numpy(), want)

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def gather(t):
        return kd.allgather(t, name="ag.fn")

    y = gather(tf.fill([r + 1, 2], float(r)))
    assert y.shape[0] == sum(k + 1 for k in range(size))


def check_opposite_order(size, r):
    @tf.function
    def step(a, b):
        names = ["first", "second"]
        if r % 2:
            names.reverse()
        out = {}
        for name in names:
            out[name] = kd.allreduce(a if name == "first" else b, op=kd.Sum, name=name)
        return out["first"], out["second"]

    for _ in range(3):
        f, s = step(tf.fill([3], float(r)), tf.fill([7], 1.0))
        np.testing.assert_array_equal(f.numpy(), np.full(3, sum(range(size)), np.float32))
        np.testing.assert_array_equal(s.numpy(), np.full(7, size, np.float32))


def check_fusion(size, r):
    @tf.function
    def step(tensors):
        return kd.grouped_allreduce(tensors, op=kd.Sum, name="many")

    tensors = [tf.fill([1024], float(i + r)) for i in range(100)]
    for _ in range(3):
        out = step(tensors)
        for i, t in enumerate(out):
            np.testing.assert_array_equal(t.numpy(), np.full(1024, size * i + sum(range(size)), np.float32))
    mixed = [tf.fill([5], r), tf.fill([6], float(r)), tf.fill([7], float(r))]
    out = kd.grouped_allreduce(mixed, op=kd.Max)
    for t, n in zip(out, (5, 6, 7)):
        np.testing.assert_array_equal(t.numpy(), np.full(n, size - 1))
    # Eager, one op for all tensors: mixed dtypes and shapes, a scalar, an
    # empty tensor, compression and tf.IndexedSlices, each in its place.
    slices = tf.IndexedSlices(tf.fill([1, 2], float(r + 1)), tf.constant([r]),
                              dense_shape=tf.constant([size, 2]))
    group = [tf.fill([2, 3], float(r + 1)), tf.constant(r + 1, tf.int64),
             tf.zeros([0], tf.float16), slices, tf.fill([4], 0.5 * (r + 1))]
    out = kd.grouped_allreduce(group, op=kd.Sum, compression=kd.Compression.fp16)
    s = sum(range(1, size + 1))
    np.testing.assert_array_equal(out[0].numpy(), np.full([2, 3], s, np.float32))
    assert out[0].dtype == tf.float32 and out[1].dtype == tf.int64
    assert int(out[1].numpy()) == s
    assert out[2].shape == (0,) and out[2].dtype == tf.float16
    assert isinstance(out[3], tf.IndexedSlices)
    dense = tf.math.unsorted_segment_sum(out[3].values, out[3].indices, size).numpy()
    np.testing.assert_array_equal(dense, [[k + 1, k + 1] for k in range(size)])
    np.testing.assert_array_equal(out[4].numpy(), np.full(4, 0.5 * s, np.float32))
    assert kd.grouped_allreduce([]) == []


def check_objects(size, r):
    obj = kd.broadcast_object({"rank": r, "data": list(range(r + 3))}, root_rank=1 % size)
    assert obj == {"rank": 1 % size, "data": list(range(1 % size + 3))}, obj
    assert kd.allgather_object(("x", r)) == [("x", k) for k in range(size)]
    kd.barrier()


def check_gradients(size, r):
    w = tf.constant([1.0, 2.0, 3.0]) * (r + 1)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(w)
        avg = kd.allreduce(w, op=kd.Average, name="g.avg")
        total = kd.allreduce(w, op=kd.Sum, name="g.sum")
        gathered = kd.allgather(tf.reshape(w, [3, 1])[: r + 1], name="g.gather")
        bc = kd.broadcast(w, root_rank=0, name="g.bc")
        loss_avg = tf.reduce_sum(avg * (r + 1))
        loss_sum = tf.reduce_sum(total * (r + 1))
        loss_gather = tf.reduce_sum(gathered * float(r + 1))
        loss_bc = tf.reduce_sum(bc * (r + 1))
    # d(sum_k loss_k)/dw_r for each op, computed by hand.
    coef = sum(k + 1 for k in range(size))
    np.testing.assert_allclose(tape.gradient(loss_avg, w).numpy(), np.full(3, coef / size))
    np.testing.assert_allclose(tape.gradient(loss_sum, w).numpy(), np.full(3, coef))
    # allgather and broadcast: Horovod's convention, averaged over ranks.
    g = tape.gradient(loss_gather, w).numpy()
    rows = min(r + 1, 3)  # this rank gathered w[: r + 1]
    np.testing.assert_allclose(g, [coef / size] * rows + [0.0] * (3 - rows))
    gb = tape.gradient(loss_bc, w).numpy()
    np.testing.assert_allclose(gb, np.full(3, coef / size if r == 0 else 0.0))
    # grouped_allreduce: one output unused, so its incoming gradient is None.
    v = tf.constant([4.0, 5.0]) * (r + 1)
    with tf.GradientTape() as tape:
        tape.watch([w, v])
        gw, gv = kd.grouped_allreduce([w, v], op=kd.Average, name="g.group")
        loss = tf.reduce_sum(gw * (r + 1))
    dw, dv = tape.gradient(loss, [w, v], unconnected_gradients="zero")
    np.testing.assert_allclose(dw.numpy(), np.full(3, coef / size))
    np.testing.assert_allclose(dv.numpy(), np.zeros(2))


def check_sparse(size, r):
    slices = tf.IndexedSlices(tf.fill([2, 3], float(r + 1)), tf.constant([r, r + 1]),
                              dense_shape=tf.constant([size + 1, 3]))
    out = kd.allreduce(slices, op=kd.Sum, name="sparse")
    assert isinstance(out, tf.IndexedSlices)
    dense = tf.math.unsorted_segment_sum(out.values, out.indices, size + 1).numpy()
    want = np.zeros([size + 1, 3])
    for k in range(size):
        want[k] += k + 1
        want[k + 1] += k + 1
    np.testing.assert_allclose(dense, want)
    dense2 = kd.allreduce(slices, op=kd.Sum, name="sparse.dense", sparse_as_dense=True)
    np.testing.assert_allclose(dense2.numpy(), want)


def check_horovod_positional_average(size, r):
    # Horovod's allreduce(tensor, average, ...): a bool second argument is
    # `average`, not an op (True must not become Sum, whose value is 1).
    import warnings

    x = tf.fill([3], float(r + 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        mean = kd.allreduce(x, True, name="positional.true").numpy()
        total = kd.allreduce(x, False, name="positional.false").numpy()
    np.testing.assert_allclose(mean, np.full(3, (size + 1) / 2))
    np.testing.assert_allclose(total, np.full(3, size * (size + 1) / 2))


def check_inputs_that_are_not_tensors(size, r):
    # Tensors skip tf.convert_to_tensor; everything else is still converted.
    total = sum(range(size))
    var = tf.Variable([float(r), 1.0])
    for label, value in (("list", [float(r), 1.0]), ("numpy", np.array([r, 1], np.int32)),
                         ("variable", var), ("tensor", tf.constant([float(r), 1.0]))):
        y = kd.allreduce(value, op=kd.Sum, name=f"input.{label}")
        np.testing.assert_array_equal(y.numpy(), [total, size])
        g = kd.allgather(value, name=f"input.ag.{label}")
        np.testing.assert_array_equal(g.numpy()[::2], range(size))
        b = kd.broadcast(value, root_rank=size - 1, name=f"input.bc.{label}")
        np.testing.assert_array_equal(b.numpy(), [size - 1, 1])
    outs = kd.grouped_allreduce([[1.0], var], op=kd.Sum, name="input.group")
    np.testing.assert_array_equal(outs[1].numpy(), [total, size])
    try:
        kd.allreduce(["a", "b"], name="input.strings")
    except TypeError as e:
        assert "Unsupported dtype" in str(e), e
    else:
        raise AssertionError("a string list was accepted")


def run():
    size, r = kd.size(), kd.rank()
    for check in (check_broadcast, check_allgather, check_opposite_order, check_fusion,
                  check_objects, check_gradients, check_sparse,
                  check_horovod_positional_average, check_inputs_that_are_not_tensors):
        check(size, r)
        log(check.__name__, "passed")


main(run)
