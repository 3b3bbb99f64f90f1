"""Randomized soak of the collectives (issue 9); run on N ranks:

    mpiexec -n 3 python tests/mp/soak.py --seed S --ops N [--only STEP]

One seed (printed) draws the whole plan on every rank: eager allreduce,
grouped allreduce, ragged allgather and broadcast from random roots with
random dtype, shape (scalars, empty, odd, up to ~1 MB), op and scale factors;
unnamed eager calls, fresh names and a pool of reused names; batches issued
from Python threads in a per-rank shuffled order; tf.functions whose
collectives are built in a per-rank shuffled order; barriers, object
collectives and join episodes (ranks join after different numbers of ops
while the others keep reducing); a few names are reused for a different
collective each time. Every result is checked against numpy
(soak_lib). A failure prints the seed, the step and its description, and
the command that replays it (`--only STEP` runs that step alone).
"""

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kerasdist as kd  # noqa: E402
import soak_lib as sl  # noqa: E402

POOL_SIZE = 12
GRAPH_COUNT = 4


class Step:
    def __init__(self, kind, ops, **fields):
        self.kind, self.ops = kind, ops
        self.__dict__.update(fields)

    def describe(self):
        if self.kind == "single":
            return "eager " + self.spec.describe()
        if self.kind == "threads":
            return "threads [" + "; ".join(s.describe() for s in self.specs) + "]"
        if self.kind == "graph":
            return f"graph fn {self.graph} rows={self.rows}"
        if self.kind == "join":
            return (f"join episode counts={self.counts}: ["
                    + "; ".join(s.describe() for s in self.specs) + "]")
        return f"{self.kind} {self.detail}"


def draw_graph(rng, g, size):
    """A tf.function's collectives; graph 0 is unnamed (fixed build order)."""
    specs = []
    for k in range(int(rng.integers(2, 7))):
        name = None if g == 0 else f"soak.g{g}.{k}"
        u = rng.random()
        if u < 0.45:
            specs.append(sl.draw_reduce_spec(rng, name, big_ok=False))
        elif u < 0.65:
            specs.append(sl.draw_reduce_spec(rng, name, grouped=True))
        elif u < 0.85:
            specs.append(sl.draw_allgather_spec(rng, name, size))
        else:
            spec = sl.draw_broadcast_spec(rng, name, range(size))
            if int(np.prod(spec.items[0][1], dtype=np.int64)) > 50000:
                spec.items[0] = (spec.items[0][0], (33,), spec.items[0][2])
            specs.append(spec)
    return specs


def build_plan(seed, n_ops, size):
    rng = np.random.default_rng([seed, 0x50A4])
    pool = [sl.draw_spec(rng, f"soak.reuse.{k}", size) for k in range(POOL_SIZE)]
    graphs = [draw_graph(rng, g, size) for g in range(GRAPH_COUNT)]
    steps, ops = [], 0

    def named_spec(name, roots=None):
        if rng.random() < 0.1:  # a reused name whose collective changes (same on all ranks)
            return sl.draw_spec(rng, f"soak.morph.{rng.integers(4)}", size, roots)
        if rng.random() < 0.4:
            spec = pool[rng.integers(POOL_SIZE)]
            if spec.kind != "broadcast" or roots is None or spec.root in roots:
                return spec
        return sl.draw_spec(rng, name, size, roots)

    while ops < n_ops:
        i = len(steps)
        u = rng.random()
        if u < 0.02:
            counts = [int(c) for c in rng.integers(3, 9, size)]
            counts[rng.integers(size)] = int(rng.integers(0, 3))  # one joins early
            if rng.random() < 0.3:
                counts = [int(c) for c in rng.integers(0, 9, size)]
            specs = []
            for j in range(max(counts)):
                active = [r for r in range(size) if counts[r] > j]
                specs.append(named_spec(f"soak.{i}.j{j}", active))
            step = Step("join", len(specs) + 2, counts=counts, specs=specs)
        elif u < 0.14:
            specs, used = [], set()
            for j in range(int(rng.integers(2, 6))):
                spec = named_spec(f"soak.{i}.t{j}")
                if spec.name in used:  # concurrent collectives need distinct names
                    spec = sl.draw_spec(rng, f"soak.{i}.t{j}", size)
                used.add(spec.name)
                specs.append(spec)
            step = Step("threads", len(specs), specs=specs)
        elif u < 0.22:
            g = int(rng.integers(GRAPH_COUNT))
            rows = {k: [int(x) for x in rng.integers(0, 6, size)]
                    for k, s in enumerate(graphs[g]) if s.kind == "allgather"}
            step = Step("graph", len(graphs[g]), graph=g, rows=rows)
        elif u < 0.24:
            name = None if rng.random() < 0.5 else f"soak.{i}.barrier"
            step = Step("barrier", 1, detail=f"name={name!r}", name=name)
        elif u < 0.27:
            what = "broadcast_object" if rng.random() < 0.5 else "allgather_object"
            root = int(rng.integers(size))
            step = Step("object", 2, detail=f"{what} root={root}", what=what, root=root)
        else:
            v = rng.random()
            if v < 0.4:
                spec = sl.draw_spec(rng, None, size)
            else:
                spec = named_spec(f"soak.{i}")
            step = Step("single", 1, spec=spec)
        steps.append(step)
        ops += step.ops
    return steps, graphs


def bound_names(steps, limit):
    """Renames every fresh and unnamed eager collective to one of `limit`
    names per kind (reused pool, morph and graph names stay). A workaround
    for measuring RSS: each new name costs ~36 KiB that TensorFlow's eager
    kernel cache keeps forever (see tests/mp/eager_name_rss.py)."""
    keep = ("soak.reuse.", "soak.morph.", "soak.g")
    for i, step in enumerate(steps):
        specs = [step.spec] if step.kind == "single" else getattr(step, "specs", [])
        for j, spec in enumerate(specs):
            if spec.name is None or not spec.name.startswith(keep):
                spec.name = f"soak.bounded.{spec.kind}.{(i * 7 + j) % limit}"
        if step.kind == "threads":  # concurrent names must stay distinct
            for j, spec in enumerate(step.specs):
                if spec.name.startswith("soak.bounded."):
                    spec.name = f"soak.bounded.t{j}.{spec.kind}.{i % limit}"
        if step.kind in ("barrier", "object"):
            step.name = f"soak.bounded.{step.kind}.{i % limit}"


def build_graph_fn(specs, order):
    """A tf.function issuing `specs` built in `order`; returns outputs in
    spec order. Allgather inputs have an unknown first dimension."""
    sig, index = [], []
    for spec in specs:
        index.append(list(range(len(sig), len(sig) + len(spec.items))))
        for dtype, shape, _ in spec.items:
            dims = [None] + list(shape) if spec.kind == "allgather" else list(shape)
            sig.append(tf.TensorSpec(dims, tf.as_dtype(dtype)))

    @tf.function(input_signature=sig, autograph=False)
    def fn(*flat):
        outs = {}
        for k in order:
            outs[k] = sl.run_spec(specs[k], [flat[i] for i in index[k]], graph=True)
        return [o for k in range(len(specs)) for o in outs[k]]

    return fn


class Soak:
    def __init__(self, seed, n_ops, progress=None, stall_seconds=90.0, only=None, log=print,
                 bounded_names=None):
        self.seed, self.n_ops, self.only = seed, n_ops, only
        self.progress, self.stall_seconds, self.log = progress, stall_seconds, log
        self.size, self.rank = kd.size(), kd.rank()
        self.steps, graphs = build_plan(seed, n_ops, self.size)
        if bounded_names:
            bound_names(self.steps, bounded_names)
        order_rng = np.random.default_rng([seed, 0x0DE, self.rank])
        self.graph_fns = []
        for g, specs in enumerate(graphs):
            order = list(range(len(specs))) if g == 0 else list(order_rng.permutation(len(specs)))
            self.graph_fns.append((specs, build_graph_fn(specs, order)))
        self.pool = ThreadPoolExecutor(max_workers=6, thread_name_prefix="soak")
        self.counts, self.ops_done, self.current = {}, 0, None
        self.last_progress = time.monotonic()

    def _watchdog(self, stop):
        reported = None
        while not stop.wait(2.0):
            cur = self.current
            if cur is not None and cur != reported and \
                    time.monotonic() - self.last_progress > self.stall_seconds:
                reported = cur
                self.log(f"SOAK STALL seed={self.seed} step={cur} after "
                         f"{self.stall_seconds:.0f} s without progress: "
                         f"{self.steps[cur].describe()}")

    def run(self):
        selected = range(len(self.steps)) if self.only is None else [self.only]
        self.log(f"SOAK start seed={self.seed} ops={self.n_ops} steps={len(self.steps)} "
                 f"size={self.size}")
        stop = threading.Event()
        threading.Thread(target=self._watchdog, args=(stop,), daemon=True).start()
        t0 = time.perf_counter()
        try:
            for i in selected:
                step = self.steps[i]
                self.current = i
                try:
                    self.execute(i, step)
                except Exception as e:
                    self.log(f"SOAK FAILURE seed={self.seed} ops={self.n_ops} step={i} "
                             f"(after {self.ops_done} ops): {step.describe()}\n"
                             f"  error: {type(e).__name__}: {e}\n  replay: mpiexec -n "
                             f"{self.size} python tests/mp/soak.py --seed {self.seed} "
                             f"--ops {self.n_ops} --only {i}")
                    raise
                self.counts[step.kind] = self.counts.get(step.kind, 0) + step.ops
                self.ops_done += step.ops
                self.last_progress = time.monotonic()
                if self.progress:
                    self.progress(self.ops_done)
        finally:
            stop.set()
            self.pool.shutdown(wait=True)
        elapsed = time.perf_counter() - t0
        return dict(seed=self.seed, ops=self.ops_done, steps=len(selected),
                    seconds=elapsed, ops_per_second=self.ops_done / elapsed,
                    ops_by_step_kind=self.counts)

    # ------------------------------------------------------------ steps

    def _check(self, i, item, spec, outs, active, rows=None):
        want = sl.expected(self.seed, i, item, spec, self.size, active, rows)
        if os.environ.get("KD_SOAK_CORRUPT") == str(i):  # self-test of the failure report
            want = [(w + np.ones((), w.dtype), t) for w, t in want]
        for j, (out, w) in enumerate(zip(outs, want)):
            dtype = spec.items[j][0]
            if out.dtype != tf.as_dtype(dtype):
                raise AssertionError(f"item {item}.{j}: dtype {out.dtype.name}, want {dtype}")
            sl.check(out.numpy(), w, dtype, f"item {item}.{j} ({spec.kind} {spec.name!r})")

    def execute(self, i, step):
        size, rank, seed = self.size, self.rank, self.seed
        everyone = list(range(size))
        if step.kind == "single":
            spec = step.spec
            outs = sl.run_spec(spec, sl.inputs(seed, i, 0, spec, rank))
            self._check(i, 0, spec, outs, everyone)
        elif step.kind == "threads":
            rng = np.random.default_rng([seed, i, 0x7E, rank])
            order = rng.permutation(len(step.specs))
            jitter = rng.random(len(step.specs)) * 0.002 * (rng.random() < 0.3)

            def issue(j):
                time.sleep(jitter[j])
                spec = step.specs[j]
                return sl.run_spec(spec, sl.inputs(seed, i, j, spec, rank))

            futures = {int(j): self.pool.submit(issue, int(j)) for j in order}
            for j, spec in enumerate(step.specs):
                self._check(i, j, spec, futures[j].result(), everyone)
        elif step.kind == "graph":
            specs, fn = self.graph_fns[step.graph]
            flat = []
            for k, spec in enumerate(specs):
                flat += sl.inputs(seed, i, k, spec, rank, step.rows.get(k))
            outs = fn(*[tf.constant(x) for x in flat])
            pos = 0
            for k, spec in enumerate(specs):
                n = len(spec.items)
                self._check(i, k, spec, outs[pos:pos + n], everyone, step.rows.get(k))
                pos += n
        elif step.kind == "join":
            for j, spec in enumerate(step.specs):
                active = [r for r in everyone if step.counts[r] > j]
                if rank in active:
                    outs = sl.run_spec(spec, sl.inputs(seed, i, j, spec, rank))
                    self._check(i, j, spec, outs, active)
            last = kd.join()
            top = max(step.counts)
            allowed = [r for r in everyone if step.counts[r] == top]
            if last not in allowed:
                raise AssertionError(f"join returned {last}; the last to join is one of {allowed}")
            lasts = kd.allgather_object(last, name="soak.join.lasts")
            if len(set(lasts)) != 1:
                raise AssertionError(f"ranks disagree on the last joiner: {lasts}")
        elif step.kind == "barrier":
            kd.barrier(name=step.name)
        elif step.kind == "object":
            def obj(r):
                rng = np.random.default_rng([seed, i, 0x0B, r])
                return {"step": i, "rank": r, "v": rng.integers(0, 1 << 40, rng.integers(0, 50)).tolist(),
                        "b": rng.bytes(int(rng.integers(0, 300)))}
            name = getattr(step, "name", None)
            if step.what == "broadcast_object":
                got = kd.broadcast_object(obj(rank), root_rank=step.root, name=name)
                want = obj(step.root)
            else:
                got, want = kd.allgather_object(obj(rank), name=name), [obj(r) for r in everyone]
            if got != want:
                raise AssertionError(f"{step.what}: got {got!r:.300}, want {want!r:.300}")
        else:
            raise ValueError(step.kind)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=None,
                   help="plan seed (default: $KD_SOAK_SEED, else random)")
    p.add_argument("--ops", type=int, default=int(os.environ.get("KD_SOAK_OPS", "2000")))
    p.add_argument("--only", type=int, default=None, help="run only this step (replay)")
    return p.parse_args(argv)


def resolve_seed(seed):
    """The seed: explicit, else $KD_SOAK_SEED, else rank 0's random draw."""
    if seed is None and os.environ.get("KD_SOAK_SEED"):
        seed = int(os.environ["KD_SOAK_SEED"])
    if seed is None:
        seed = kd.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 31)),
                                   root_rank=0, name="soak.seed")
    return seed


def main():
    from _util import log, main as run_main

    def run():
        args = parse_args()
        seed = resolve_seed(args.seed)
        log(f"SOAK seed={seed}")
        stats = Soak(seed, args.ops, only=args.only, log=log).run()
        log(f"SOAK OK seed={stats['seed']} ops={stats['ops']} steps={stats['steps']} "
            f"seconds={stats['seconds']:.1f} ops/s={stats['ops_per_second']:.0f} "
            f"by kind={stats['ops_by_step_kind']}")

    run_main(run)


if __name__ == "__main__":
    main()
