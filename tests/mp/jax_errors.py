"""Bad input to kerasdist.jax at np=2 and np=3, eagerly and inside
`jax.jit`: every rank gets a clear error that names the collective, and the
engine keeps working. Prints "<name> passed"."""

import time

import jax
import jax.numpy as jnp
import numpy as np

import kerasdist.jax as kd
from _util import log, main


def expect(exc, fn, *needles):
    try:
        out = fn()
        jax.block_until_ready(out)
    except exc as e:
        for needle in needles:
            assert needle in str(e), (needle, str(e))
        return str(e)
    raise AssertionError(f"no {exc} raised")


def still_works(tag):
    n = kd.size()
    f = jax.jit(lambda x: kd.allreduce(x, op=kd.Sum, name=f"after.{tag}"))
    assert np.array_equal(np.asarray(f(jnp.ones(3))), np.full(3, float(n)))
    assert np.array_equal(np.asarray(kd.allreduce(jnp.ones(2), op=kd.Sum)), np.full(2, float(n)))


def check_local_errors_are_clear():
    n = kd.size()
    jit = jax.jit
    expect(TypeError, lambda: kd.allreduce(jnp.ones(2, jnp.uint32)), "uint32", "allreduce")
    expect(TypeError, lambda: jit(lambda x: kd.allreduce(x))(jnp.ones(2, jnp.complex64)),
           "complex64")
    expect(ValueError, lambda: kd.allreduce(jnp.ones(2, bool), op=kd.Sum), "Min or op=Max")
    expect(ValueError, lambda: kd.allreduce(jnp.ones(2), op=5), "`op`")
    expect(ValueError, lambda: kd.reducescatter(jnp.ones(4), op=kd.Max), "Average or Sum")
    expect(ValueError, lambda: kd.allgather(jnp.ones(())), "scalar")
    expect(ValueError, lambda: kd.broadcast(jnp.ones(2), root_rank=n), "root_rank")
    expect(ValueError, lambda: jit(lambda x: kd.alltoall(x, splits=[1] * n))(jnp.ones(n)),
           "outside `jax.jit`")
    expect(ValueError, lambda: jit(lambda x: kd.alltoall(x))(jnp.ones(n + 1)), "divisible")
    expect(TypeError, lambda: kd.allreduce(jnp.ones(2), process_set=[0]), "ProcessSet")
    expect(TypeError, lambda: kd.allreduce(jnp.ones(2), name=3), "name")
    still_works("local")
    log("check_local_errors_are_clear passed")


def check_mismatches_fail_on_every_rank():
    r, n = kd.rank(), kd.size()
    last = n - 1
    Err = jax.errors.JaxRuntimeError
    for mode in ("jit", "eager"):
        E = Err if mode == "jit" else kd.HorovodInternalError

        def run(fn, *args):
            return jax.jit(fn)(*args) if mode == "jit" else fn(*args)

        x = jnp.ones(4, jnp.int32 if r == last else jnp.float32)
        msg = expect(E, lambda: run(lambda x: kd.allreduce(x, name=f"mix.dtype.{mode}"), x),
                     f"mix.dtype.{mode}")
        assert "type" in msg.lower(), msg
        still_works(f"dtype.{mode}")
        expect(E, lambda: run(lambda x: kd.allreduce(x, name=f"mix.shape.{mode}"),
                              jnp.ones(4 + (r == last))), f"mix.shape.{mode}")
        still_works(f"shape.{mode}")
        expect(E, lambda: run(lambda x: kd.allreduce(x, op=kd.Max if r == last else kd.Sum,
                                                     name=f"mix.op.{mode}"), jnp.ones(2)),
               f"mix.op.{mode}")
        still_works(f"op.{mode}")
        expect(E, lambda: run(lambda x: kd.broadcast(x, root_rank=r, name=f"mix.root.{mode}"),
                              jnp.ones(2)), f"mix.root.{mode}")
        still_works(f"root.{mode}")
    # Pieces of different sizes: eager takes them, jit fails on every rank.
    msg = expect(Err, lambda: jax.jit(lambda x: kd.allgather(x, name="ragged.jit"))(
        jnp.ones((r + 1, 2))), "ragged.jit", "equal size", "outside `jax.jit`")
    assert str(list(range(1, n + 1))).replace(",", ", ").replace(",  ", ", ") in msg or \
        ", ".join(str(q + 1) for q in range(n)) in msg, msg
    still_works("ragged")
    log("check_mismatches_fail_on_every_rank passed")


def check_rank_dependent_order_completes_when_xla_runs_them_concurrently():
    """Two independent collectives emitted in a rank-dependent order, in a
    program XLA runs concurrently (more than 8 thunks, large buffers): both
    complete, the futures letting each rank's pending call wait."""
    r, n = kd.rank(), kd.size()

    def independent(x, y):
        names = ["free.A", "free.B"] if r % 2 == 0 else ["free.B", "free.A"]
        ins, outs = {"free.A": x, "free.B": y}, {}
        for name in names:
            outs[name] = kd.allreduce(jnp.sin(ins[name]) * 2.0 + 1.0, op=kd.Sum, name=name)
        extra = sum(jnp.cos(x * i) for i in range(10))
        return outs["free.A"], outs["free.B"], extra

    x, y = jnp.ones(1 << 18), jnp.full(1 << 18, 2.0)
    for _ in range(3):
        a, b, _ = jax.jit(independent)(x, y)
        assert np.allclose(np.asarray(a), n * (np.sin(1.0) * 2 + 1), rtol=1e-6)
        assert np.allclose(np.asarray(b), n * (np.sin(2.0) * 2 + 1), rtol=1e-6)
    log("check_rank_dependent_order_completes_when_xla_runs_them_concurrently passed")


def check_rank_dependent_order_ends_within_the_bound():
    """Two collectives in one jitted function, in an order that depends on
    the rank and chained by data: no schedule can complete them, so the
    deadlock rule ends both on every rank, naming each rank's tensor."""
    r = kd.rank()

    def crossed(x):
        if r % 2 == 0:
            a = kd.allreduce(x, op=kd.Sum, name="order.A")
            return kd.allreduce(a + 1.0, op=kd.Sum, name="order.B")
        b = kd.allreduce(x, op=kd.Sum, name="order.B")
        return kd.allreduce(b + 1.0, op=kd.Sum, name="order.A")

    start = time.monotonic()
    msg = expect(jax.errors.JaxRuntimeError, lambda: jax.jit(crossed)(jnp.ones(8)),
                 "order.A", "order.B", "Deadlock")
    took = time.monotonic() - start
    log(f"deadlock reported after {took:.1f} s: {msg[:160]}")
    log("check_rank_dependent_order_ends_within_the_bound passed")


def _all():
    check_local_errors_are_clear()
    check_mismatches_fail_on_every_rank()
    check_rank_dependent_order_completes_when_xla_runs_them_concurrently()
    check_rank_dependent_order_ends_within_the_bound()


if __name__ == "__main__":
    main(_all)
