"""kerasdist.jax's collectives at np=2 and np=3, eagerly and inside
`jax.jit`, against numpy.

Every check prints "<name> passed" on every rank; tests/test_jax_mp.py
counts them. Values are small integers, so that every dtype's result is
exact and the expected values are computed in float64 with numpy.
"""

import jax
import jax.numpy as jnp
import numpy as np

import kerasdist.jax as kd
from _util import log, main

INTS = ["uint8", "int8", "int16", "int32", "int64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
DTYPES = INTS + FLOATS
MODES = ("eager", "jit")
jax.config.update("jax_enable_x64", True)  # int64 and float64 stay 64-bit


def value(rank, shape, dtype, low=1, high=4):
    """Rank `rank`'s deterministic small-integer array."""
    n = int(np.prod(shape)) if shape else 1
    base = (np.arange(n) * 7 + rank * 3) % (high - low) + low
    return jnp.asarray(base.reshape(shape).astype(np.float64)).astype(dtype)


def as_np(x):
    x = np.asarray(x)
    return x if x.dtype == bool or x.dtype.kind == "u" and x.itemsize == 4 else \
        x.astype(np.float64)


def same(got, want, what):
    got = as_np(got)
    assert got.shape == np.shape(want), (what, got.shape, np.shape(want))
    assert np.array_equal(got, want), (what, got, want)


def run(mode, fn, *args):
    """fn(*args) eagerly, or jitted (a fresh trace, so names stay as given)."""
    return fn(*args) if mode == "eager" else jax.jit(fn)(*args)


def check_allreduce_every_dtype_and_op():
    r, n = kd.rank(), kd.size()
    for mode in MODES:
        for dtype in DTYPES:
            for op, fold in ((kd.Sum, np.sum), (kd.Min, np.min), (kd.Max, np.max),
                             (kd.Product, np.prod), (kd.Average, None)):
                shape = (3, 5)
                xs = [as_np(value(q, shape, dtype)) for q in range(n)]
                if op == kd.Average:
                    want = np.sum(xs, axis=0) / n
                    if dtype in INTS:
                        want = np.trunc(want)
                else:
                    want = fold(xs, axis=0)
                name = f"ar.{mode}.{dtype}.{op}"
                got = run(mode, lambda x: kd.allreduce(x, op=op, name=name),
                          value(r, shape, dtype))
                assert got.dtype == jnp.dtype(dtype), (got.dtype, dtype)
                if dtype in ("float16", "bfloat16") and op == kd.Average:
                    assert np.allclose(as_np(got), want, rtol=1e-2), (mode, dtype, op)
                else:
                    same(got, want, (mode, dtype, op))
        for op, fold in ((kd.Min, np.all), (kd.Max, np.any)):
            x = jnp.asarray([True, r % 2 == 0, False, r == 0])
            want = fold([[True, q % 2 == 0, False, q == 0] for q in range(n)], axis=0)
            same(run(mode, lambda x: kd.allreduce(x, op=op, name=f"b.{mode}.{op}"), x), want,
                 ("bool", op))
    log("check_allreduce_every_dtype_and_op passed")


def check_grouped_scales_steps_and_aliasing():
    r, n = kd.rank(), kd.size()
    want = sum(as_np(value(q, (4, 6), "float32")) for q in range(n)) * 0.5 * 4.0
    for mode in MODES:
        same(run(mode, lambda x: kd.allreduce(x, op=kd.Sum, prescale_factor=0.5,
                                              postscale_factor=4.0, name=f"sc.{mode}"),
                 value(r, (4, 6), "float32")), want, "scale")
        mixed = [value(r, (2, 2), "float32"), value(r, (5,), "int64"),
                 value(r, (3, 1), "float64"), value(r, (), "bfloat16")]
        outs = run(mode, lambda *m: kd.grouped_allreduce(list(m), op=kd.Sum,
                                                         name=f"grouped.{mode}"), *mixed)
        for i, out in enumerate(outs):
            assert out.dtype == mixed[i].dtype
            want_i = sum(as_np(value(q, mixed[i].shape, mixed[i].dtype)) for q in range(n))
            same(out, want_i, (mode, "grouped", i))
        empty = run(mode, lambda x: kd.allreduce(x, op=kd.Sum, name=f"empty.{mode}"),
                    jnp.zeros((0, 3)))
        assert empty.shape == (0, 3)
    # One jitted function, many steps: the same names every call, fresh data.
    step = jax.jit(lambda x, s: kd.allreduce(x * s, op=kd.Sum, name="steps") + 1.0)
    for s in range(60):
        same(step(jnp.full((257,), float(r + 1)), float(s)),
             np.full(257, s * n * (n + 1) / 2 + 1.0), f"step {s}")
    # Under vmap the batch is reduced as one array (elementwise ops).
    batched = jnp.stack([jnp.full((5,), float(r + b)) for b in range(3)])
    got = jax.jit(jax.vmap(lambda a: kd.allreduce(a, op=kd.Sum, name="vmapped")))(batched)
    same(got, np.stack([np.full(5, n * (n - 1) / 2 + n * b) for b in range(3)]), "vmap")
    # Donated input: XLA may reduce in place (input/output aliasing).
    donate = jax.jit(lambda x: kd.allreduce(x, op=kd.Max, name="donated"), donate_argnums=0)
    for s in range(3):
        same(donate(jnp.full((1000,), float(r + s))), np.full(1000, float(n - 1 + s)),
             "donated")
    log("check_grouped_scales_steps_and_aliasing passed")


def check_allgather_broadcast_alltoall_reducescatter():
    r, n = kd.rank(), kd.size()
    for dtype in DTYPES + ["bool", "uint32"]:
        def mine(q, rows):
            if dtype == "bool":
                return jnp.asarray([[q % 2 == 0, True]] * rows)
            if dtype == "uint32":
                return jnp.full((rows, 2), 4_000_000_000 + q, jnp.uint32)
            return value(q, (rows, 2), dtype)
        # Eager: ragged; inside jit: equal pieces.
        got = kd.allgather(mine(r, r + 1), name=f"ag.{dtype}")
        assert got.dtype == jnp.dtype(dtype)
        same(got, np.concatenate([as_np(mine(q, q + 1)) for q in range(n)]), ("ag", dtype))
        got = jax.jit(lambda x: kd.allgather(x, name=f"agj.{dtype}"))(mine(r, 2))
        same(got, np.concatenate([as_np(mine(q, 2)) for q in range(n)]), ("agj", dtype))
        for root in range(n):
            for mode in MODES:
                got = run(mode, lambda x: kd.broadcast(x, root, name=f"bc.{mode}.{dtype}.{root}"),
                          mine(r, 3))
                same(got, as_np(mine(root, 3)), (mode, "bcast", dtype, root))
        # alltoall: eager with splits, inside jit evenly.
        rows = [(r + j) % 3 + 1 for j in range(n)]
        send = jnp.concatenate([mine(100 * r + j, rows[j]) for j in range(n)])
        out, received = kd.alltoall(send, splits=rows, name=f"a2a.{dtype}")
        want_rows = [(q + r) % 3 + 1 for q in range(n)]
        assert list(np.asarray(received)) == want_rows, (received, want_rows)
        same(out, np.concatenate([as_np(mine(100 * q + r, want_rows[q])) for q in range(n)]),
             ("a2a", dtype))
        even = jnp.concatenate([mine(100 * r + j, 2) for j in range(n)])
        got = jax.jit(lambda x: kd.alltoall(x, name=f"a2aj.{dtype}"))(even)
        same(got, np.concatenate([as_np(mine(100 * q + r, 2)) for q in range(n)]),
             ("a2aj", dtype))
    for mode in MODES:
        for dim0 in (2 * n, 2 * n + 1):
            for op in (kd.Sum, kd.Average):
                total = sum(as_np(value(q, (dim0, 3), "float64")) for q in range(n))
                if op == kd.Average:
                    total = total / n
                start = r * (dim0 // n) + min(r, dim0 % n)
                stop = start + dim0 // n + (1 if r < dim0 % n else 0)
                got = run(mode, lambda x: kd.reducescatter(x, op=op,
                                                           name=f"rs.{mode}.{dim0}.{op}"),
                          value(r, (dim0, 3), "float64"))
                same(got, total[start:stop], (mode, "reducescatter", dim0, op))
    # PRNG keys: legacy uint32 keys and typed keys travel.
    key = jax.random.PRNGKey(r)
    same(kd.broadcast(key, 0, name="key.bc"), np.asarray(jax.random.PRNGKey(0)), "key bcast")
    typed = jax.jit(lambda k: kd.broadcast(k, n - 1, name="tkey.bc"))(jax.random.key(r))
    assert np.array_equal(jax.random.key_data(typed), jax.random.key_data(jax.random.key(n - 1)))
    keys = kd.allgather(jax.random.key(r)[None], name="tkey.ag")
    assert keys.shape == (n,) and jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)
    for q in range(n):
        assert np.array_equal(jax.random.key_data(keys[q]),
                              jax.random.key_data(jax.random.key(q)))
    kd.barrier()
    log("check_allgather_broadcast_alltoall_reducescatter passed")


def check_gradients():
    r, n = kd.rank(), kd.size()
    x = value(r, (n * 2, 3), "float32")
    w = jnp.arange(n * 2 * 3, dtype=jnp.float32).reshape(n * 2, 3) / 8.0
    for mode in MODES:
        g = run(mode, jax.grad(lambda x: (kd.allreduce(x, op=kd.Sum, name=f"g.ar.{mode}")
                                          * w).sum()), x)
        same(g, as_np(w) * n, (mode, "allreduce"))   # Sum of equal cotangents
        g = run(mode, jax.grad(lambda x: (kd.allreduce(x, name=f"g.avg.{mode}",
                                                       postscale_factor=2.0) * w).sum()), x)
        assert np.allclose(as_np(g), as_np(w) * 2.0), (mode, "average")
        wg = jnp.arange(n * 2 * n * 3, dtype=jnp.float32).reshape(2 * n * n, 3)
        g = run(mode, jax.grad(lambda x: (kd.allgather(x, name=f"g.ag.{mode}") * wg).sum()), x)
        same(g, as_np(wg)[r * 2 * n:(r + 1) * 2 * n], (mode, "allgather"))
        g = run(mode, jax.grad(lambda x: (kd.broadcast(x, 0, name=f"g.bc.{mode}") * w).sum()), x)
        same(g, as_np(w) if r == 0 else np.zeros_like(as_np(w)), (mode, "broadcast"))
        g = run(mode, jax.grad(lambda x: (kd.alltoall(x, name=f"g.a2a.{mode}") * w).sum()), x)
        # Block j of this rank's input became block r of rank j's output, whose
        # cotangent is w's block r.
        same(g, np.tile(as_np(w)[2 * r:2 * r + 2], (n, 1)), (mode, "alltoall"))
        g = run(mode, jax.grad(lambda x: (kd.reducescatter(x, op=kd.Sum, name=f"g.rs.{mode}")
                                          * w[:2]).sum()), x)
        same(g, np.tile(as_np(w[:2]), (n, 1)) * n, (mode, "reducescatter"))
        # Uneven blocks (the first dim0 % n ranks get a row more), in jit too.
        dim0 = 2 * n + 1
        rows = [dim0 // n + (1 if q < dim0 % n else 0) for q in range(n)]
        wq = [np.arange(rows[q] * 3, dtype=np.float32).reshape(rows[q], 3) + q for q in range(n)]
        g = run(mode, jax.grad(lambda x: (kd.reducescatter(x, op=kd.Sum, name=f"g.rsu.{mode}")
                                          * wq[r]).sum()), value(r, (dim0, 3), "float32"))
        same(g, np.concatenate(wq) * n, (mode, "uneven reducescatter"))
        # A group of a float and an int tensor: the int one has no gradient.
        g = run(mode, jax.grad(lambda x: kd.grouped_allreduce(
            [x, jnp.ones(2, jnp.int32)], op=kd.Sum, name=f"g.mixed.{mode}")[0].sum()), x)
        same(g, np.full(x.shape, float(n)), (mode, "mixed group"))
    # Ragged allgather, eagerly: this rank's rows of the averaged gradient.
    xr = jnp.ones((r + 1, 2))
    total = n * (n + 1) // 2
    wr = jnp.arange(total * 2, dtype=jnp.float32).reshape(total, 2)
    g = jax.grad(lambda x: (kd.allgather(x, name="g.ragged") * wr).sum())(xr)
    start = r * (r + 1) // 2
    same(g, as_np(wr)[start:start + r + 1], "ragged allgather grad")
    log("check_gradients passed")


def check_process_sets():
    r, n = kd.rank(), kd.size()
    ps = kd.add_process_set([0, n - 1])
    if r in (0, n - 1):
        for mode in MODES:
            got = run(mode, lambda x: kd.allreduce(x, op=kd.Sum, process_set=ps,
                                                   name=f"ps.{mode}"), jnp.full(3, r + 1.0))
            same(got, np.full(3, 1.0 + n), (mode, "process set"))
            got = run(mode, lambda x: kd.allgather(x, process_set=ps, name=f"psag.{mode}"),
                      jnp.full((1,), float(r)))
            same(got, np.array([0.0, n - 1.0]), (mode, "process set allgather"))
            got = run(mode, lambda x: kd.broadcast(x, n - 1, process_set=ps,
                                                   name=f"psbc.{mode}"), jnp.full(2, float(r)))
            same(got, np.full(2, n - 1.0), (mode, "process set broadcast"))
    kd.remove_process_set(ps)
    log("check_process_sets passed")


def _all_checks():
    check_allreduce_every_dtype_and_op()
    check_grouped_scales_steps_and_aliasing()
    check_allgather_broadcast_alltoall_reducescatter()
    check_gradients()
    check_process_sets()


if __name__ == "__main__":
    main(_all_checks)
