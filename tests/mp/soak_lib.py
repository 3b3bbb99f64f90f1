"""The randomized soak: a plan of collectives drawn from one seed, and numpy
references for them.

Every rank draws the same plan from the shared seed and can compute every
rank's input (each input has its own generator keyed by seed, step, item and
rank), so every result is checked against a reference that all ranks compute
identically. Only the submission order is rank-specific: thread batches and
graph functions are issued/built in a per-rank shuffled order.

The reference follows the documented semantics: sums wrap (integers) in the
element type as numpy's do; averages of int8/uint8 accumulate in int32 and of
int32 in int64, then truncate toward zero; float averages are compared with
a tolerance (float16 divides before summing); integer scale factors multiply
in double and truncate toward zero; a joined rank contributes zeros and is
left out of the divisor of averages.
"""

import numpy as np
import tensorflow as tf

import kerasdist as kd

DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "int8"]
FLOATS = ("float16", "bfloat16", "float32", "float64")
OPS = [kd.Average, kd.Sum, kd.Min, kd.Max, kd.Product]
OP_NAMES = {kd.Average: "Average", kd.Sum: "Sum", kd.Min: "Min", kd.Max: "Max",
            kd.Product: "Product"}
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -22,
       "float64": 2.0 ** -51}
WIDE_ACC = {"int8": np.int32, "uint8": np.int32, "int32": np.int64}
MAX_BYTES = 1 << 20


def np_dtype(name):
    return tf.as_dtype(name).as_numpy_dtype


class Spec:
    """One collective: kind is allreduce, grouped, allgather or broadcast.

    allreduce/grouped: items = [(dtype, shape, profile)], op, pre, post.
    allgather: items = [(dtype, trailing_shape, profile)], dim0 = per-rank rows.
    broadcast: items = [(dtype, shape, profile)], root.
    """

    def __init__(self, kind, name, items, op=None, pre=1.0, post=1.0, root=None, dim0=None):
        self.kind, self.name, self.items = kind, name, items
        self.op, self.pre, self.post, self.root, self.dim0 = op, pre, post, root, dim0

    def describe(self):
        parts = [self.kind, f"name={self.name!r}"]
        parts.append("items=[" + ", ".join(f"{d}{list(s)}:{p}" for d, s, p in self.items) + "]")
        if self.op is not None:
            parts.append(f"op={OP_NAMES[self.op]} pre={self.pre} post={self.post}")
        if self.root is not None:
            parts.append(f"root={self.root}")
        if self.dim0 is not None:
            parts.append(f"dim0={list(self.dim0)}")
        return " ".join(parts)


# ---------------------------------------------------------------- drawing


def draw_shape(rng, dtype, big_ok=True):
    u = rng.random()
    if u < 0.08:
        return ()
    if u < 0.15:
        return [(0,), (0, 3), (2, 0, 5), (3, 0)][rng.integers(4)]
    if u < 0.50:
        return (int(rng.choice([1, 2, 3, 5, 7, 17, 31, 97, 127, 1001])),)
    if u < 0.80:
        return tuple(int(d) for d in rng.integers(1, 10, size=rng.integers(1, 4)))
    if u < 0.96 or not big_ok:
        return (int(rng.integers(1000, 50000)),)
    elem = np.dtype(np_dtype(dtype)).itemsize
    return (MAX_BYTES // elem - int(rng.integers(0, 100)),)  # up to ~1 MB, odd sizes


def draw_scale(rng):
    if rng.random() < 0.7:
        return 1.0, 1.0
    return float(rng.choice([0.5, 1.0, 2.0])), float(rng.choice([0.5, 1.0]))


def draw_profile(rng, dtype, op, scaled):
    if dtype in FLOATS:
        if op == kd.Product:
            return "prod"
        if op == kd.Sum and dtype == "float16" and not scaled and rng.random() < 0.05:
            return "f16big"
        return "exact" if rng.random() < 0.75 else "normal"
    if op == kd.Product:
        return "prod" if scaled or rng.random() < 0.6 else "wide"
    return "small" if scaled or rng.random() < 0.5 else "wide"


def make_values(rng, dtype, profile, shape, op=None):
    n = int(np.prod(shape, dtype=np.int64))
    npd = np_dtype(dtype)
    if profile == "exact":  # sums of 3 ranks x scale 2 stay exact
        if dtype == "float16":
            v = rng.integers(-256, 256, n) / 4.0
        elif dtype == "bfloat16":
            v = rng.integers(-40, 41, n).astype(np.float64)
        else:
            v = rng.integers(-4096, 4096, n) / 4.0
    elif profile == "normal":
        v = rng.standard_normal(n) * (10.0 if dtype in ("float16", "bfloat16") else 100.0)
    elif profile == "f16big":  # multiples of float16's spacing there; the sum is inf
        v = 32.0 * rng.integers(900, 1800, n)
    elif profile == "prod":
        if dtype in FLOATS:
            v = rng.choice([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], n)
        else:
            v = rng.integers(1, 4, n) if dtype == "uint8" else rng.integers(-3, 4, n)
    elif profile == "small":
        lo, hi = {"int8": (-20, 21), "uint8": (0, 41)}.get(dtype, (-1000, 1001))
        v = rng.integers(lo, hi, n)
    elif profile == "wide":
        info = np.iinfo(npd)
        lo, hi = int(info.min), int(info.max)
        if dtype == "int64" and op == kd.Average:
            lo, hi = -(1 << 60), 1 << 60  # the int64 sum of 3 ranks must not wrap
        return rng.integers(lo, hi, n, dtype=npd, endpoint=True).reshape(shape)
    else:
        raise ValueError(profile)
    return v.astype(npd).reshape(shape)


def draw_reduce_spec(rng, name, grouped=False, big_ok=True):
    op = OPS[rng.integers(len(OPS))]
    pre, post = draw_scale(rng)
    scaled = (pre, post) != (1.0, 1.0)
    count = int(rng.integers(1, 6)) if grouped else 1
    items = []
    for _ in range(count):
        dtype = DTYPES[rng.integers(len(DTYPES))]
        items.append((dtype, draw_shape(rng, dtype, big_ok and not grouped),
                      draw_profile(rng, dtype, op, scaled)))
    return Spec("grouped" if grouped else "allreduce", name, items, op, pre, post)


def draw_allgather_spec(rng, name, size):
    dtype = DTYPES[rng.integers(len(DTYPES))]
    trailing = [(), (3,), (2, 5), (1,), (0,)][rng.integers(5)]
    if rng.random() < 0.1:
        rows = [0] * size
    elif rng.random() < 0.05:
        rows = [int(x) for x in rng.integers(3000, 30000, size)]
    else:
        rows = [int(x) for x in rng.integers(0, 7, size)]
    return Spec("allgather", name, [(dtype, trailing, "wide" if dtype not in FLOATS else "normal")],
                dim0=rows)


def draw_broadcast_spec(rng, name, roots):
    dtype = DTYPES[rng.integers(len(DTYPES))]
    prof = "wide" if dtype not in FLOATS else "normal"
    return Spec("broadcast", name, [(dtype, draw_shape(rng, dtype), prof)],
                root=int(roots[rng.integers(len(roots))]))


def draw_spec(rng, name, size, roots=None):
    u = rng.random()
    if u < 0.55:
        return draw_reduce_spec(rng, name)
    if u < 0.70:
        return draw_reduce_spec(rng, name, grouped=True)
    if u < 0.85:
        return draw_allgather_spec(rng, name, size)
    return draw_broadcast_spec(rng, name, roots if roots is not None else range(size))


# ---------------------------------------------------------------- inputs and references


def inputs(seed, step, item, spec, r, rows=None):
    """Rank r's tensors for `spec` (one per item) at (step, item)."""
    out = []
    for j, (dtype, shape, profile) in enumerate(spec.items):
        rng = np.random.default_rng([seed, step, item, j, r])
        if spec.kind == "allgather":
            shape = (spec.dim0[r] if rows is None else rows[r],) + tuple(shape)
        out.append(make_values(rng, dtype, profile, shape, spec.op))
    return out


def _scale_int(v, f):
    if f == 1.0:
        return v
    return np.trunc(v.astype(np.float64) * f).astype(v.dtype)


def _trunc_div(s, n):
    q = s // n
    return q + ((s % n != 0) & (s < 0)).astype(s.dtype)


def reduce_ref(xs, dtype, op, pre, post, contributors, exact):
    """Reference of an allreduce; xs has one array per rank (zeros for joined
    ranks). Returns (reference, tolerance or None for an exact check)."""
    if dtype in FLOATS:
        a = np.stack([x.astype(np.float64) for x in xs]) * pre
        if op in (kd.Sum, kd.Average):
            s = a.sum(0)
            if op == kd.Average:
                s = s / contributors
        elif op == kd.Min:
            s = a.min(0)
        elif op == kd.Max:
            s = a.max(0)
        else:
            s = a.prod(0)
        ref = s * post
        if op == kd.Average or not exact:
            return ref, EPS[dtype] * 8 * abs(pre * post) * np.abs(a).sum(0) + 1e-6
        with np.errstate(over="ignore"):  # float16 sums past 65504 are inf, as numpy's
            return ref.astype(np_dtype(dtype)).astype(np.float64), None
    acc = WIDE_ACC.get(dtype, np_dtype(dtype)) if op == kd.Average else np_dtype(dtype)
    a = np.stack([_scale_int(x.astype(acc), pre) for x in xs])
    if op in (kd.Sum, kd.Average):
        s = a.sum(0, dtype=acc)
        if op == kd.Average and contributors > 1:
            s = _trunc_div(s, acc(contributors))
    elif op == kd.Min:
        s = a.min(0)
    elif op == kd.Max:
        s = a.max(0)
    else:
        s = a.prod(0, dtype=acc)
    return _scale_int(s, post).astype(np_dtype(dtype)), None


def expected(seed, step, item, spec, size, active, rows=None):
    """The result every active rank must get for `spec`, one per item, each
    as (reference, tolerance)."""
    if spec.kind == "broadcast":
        return [(x, None) for x in inputs(seed, step, item, spec, spec.root)]
    if spec.kind == "allgather":
        parts = [inputs(seed, step, item, spec, r, rows)[0] for r in active]
        return [(np.concatenate(parts, axis=0), None)]
    per_rank = [inputs(seed, step, item, spec, r) if r in active else None for r in range(size)]
    out = []
    for j, (dtype, shape, profile) in enumerate(spec.items):
        zeros = np.zeros(shape, np_dtype(dtype))
        xs = [per_rank[r][j] if per_rank[r] is not None else zeros for r in range(size)]
        out.append(reduce_ref(xs, dtype, spec.op, spec.pre, spec.post, len(active),
                              exact=profile != "normal"))
    return out


def check(got, want, dtype, what):
    """Raises AssertionError naming the first bad element."""
    ref, tol = want
    got = np.asarray(got)
    if got.shape != ref.shape:
        raise AssertionError(f"{what}: shape {got.shape}, want {ref.shape}")
    if dtype in FLOATS:
        g, w = got.astype(np.float64), ref.astype(np.float64)
        bad = ~(np.abs(g - w) <= tol) if tol is not None else ~(g == w)
    else:
        g, w = got, ref
        bad = g != w
    if bad.any():
        idx = np.unravel_index(int(np.argmax(bad)), bad.shape) if bad.ndim else ()
        extra = f" (tolerance {np.asarray(tol)[idx]})" if tol is not None else ""
        raise AssertionError(f"{what}: {int(bad.sum())} wrong elements; first at {idx}: "
                             f"got {g[idx]!r}, want {w[idx]!r}{extra}")


def run_spec(spec, xs, graph=False):
    """Issues `spec` eagerly (or while tracing) and returns its outputs."""
    ts = [tf.constant(x) if not graph else x for x in xs]
    if spec.kind == "allreduce":
        return [kd.allreduce(ts[0], op=spec.op, name=spec.name, prescale_factor=spec.pre,
                             postscale_factor=spec.post)]
    if spec.kind == "grouped":
        return kd.grouped_allreduce(ts, op=spec.op, name=spec.name, prescale_factor=spec.pre,
                                    postscale_factor=spec.post)
    if spec.kind == "allgather":
        return [kd.allgather(ts[0], name=spec.name)]
    return [kd.broadcast(ts[0], root_rank=spec.root, name=spec.name)]
