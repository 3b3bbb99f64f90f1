"""JAX benchmark: kerasdist.jax inside `jax.jit` against JAX's own
cross-process collectives over gloo and MPICH; Keras on JAX with kerasdist
against `keras.distribution.DataParallel`.

    python benchmarks/jax_keras.py [--np 2] [--sizes 4K 64K 1M 16M 64M]
        [--models mnist resnet50 embedding] [--steps N] [--json PATH]
        [--png PATH] [--quick]

Two levels, every configuration in one run:
- collectives (one mpiexec job, all methods interleaved per size): float32
  sums of a jitted function's input, with `kerasdist.jax.allreduce` inside
  `jax.jit` (an XLA FFI custom call), `jax.lax.psum` in a jitted
  `jax.shard_map` over `jax.distributed` with
  `jax_cpu_collectives_implementation="gloo"` (its coordinator on
  127.0.0.1), kerasdist's again with the input donated (`donate_argnums`,
  so XLA reduces in the input's buffer), MPICH's `MPI_Allreduce` (mpi4py) and a local memcpy. Per
  size, blocks rotate the methods' order; a rank's time is its smallest
  block median, the reported time the largest over ranks. Bus bandwidth is
  `bytes * 2(N-1)/N / time`. Each JAX call includes its dispatch and the
  wait for its result, as a train step sees it.
- models (benchmarks/_jax_models.py, one job per configuration): samples/s
  of `train_on_batch` steps for the models of benchmarks/keras_synthetic.py,
  with kerasdist's DistributedOptimizer and with `DataParallel` over
  `jax.distributed` (gloo) at np=N, and plain Keras on JAX in one process.
  Every configuration uses XLA's default threads.

It prints the tables, writes JSON and, with --png, a plot.
"""

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from keras_synthetic import MODELS  # noqa: E402
from torch_ddp import KIB, SIZES, Runner, busbw, parse_size  # noqa: E402

METHODS = ("kerasdist", "kd donated", "gloo", "MPICH", "memcpy")
LABELS = {"kd": "kerasdist", "dp": "DataParallel (gloo)", "plain": "plain np=1"}


def collectives_worker(args):
    """One rank of the collectives job (under mpiexec)."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from mpi4py import MPI

    import kerasdist.jax as kd

    kd.init()
    comm, rank, size = MPI.COMM_WORLD, kd.rank(), kd.size()
    jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=size,
                               process_id=rank)
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((size,), ("x",), devices=jax.devices())
    sharding = NamedSharding(mesh, P("x"))
    gloo = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh,
                                 in_specs=P("x"), out_specs=P("x")))
    mine = jax.jit(lambda a: kd.allreduce(a, op=kd.Sum, name="bench"))
    # Donated: XLA reduces in the input's buffer (Max keeps the values, so
    # each call's output is the next one's input).
    donated = jax.jit(lambda a: kd.allreduce(a, op=kd.Max, name="bench.donated"),
                      donate_argnums=0)
    chain = {}
    results = []
    for nbytes in args.sizes:
        n = nbytes // 4
        src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
        local = jax.device_put(src, jax.local_devices()[0])
        spread = jax.make_array_from_process_local_data(sharding, src)
        iters = max(3, min(200, int(64 * 1024 * 1024 / max(nbytes, 1) // 4) + 3))
        chain["x"] = jax.device_put(src, jax.local_devices()[0])

        def run_donated():
            chain["x"] = donated(chain["x"])
            chain["x"].block_until_ready()

        ops = {
            "kerasdist": lambda: mine(local).block_until_ready(),
            "kd donated": run_donated,
            "gloo": lambda: gloo(spread).block_until_ready(),
            "MPICH": lambda: comm.Allreduce(src, dst, op=MPI.SUM),
            "memcpy": lambda: np.copyto(dst, src),
        }
        got = np.asarray(mine(local))
        assert got[0] == size and got[-1] == size, "kerasdist: wrong sum"
        got = np.asarray(gloo(spread).addressable_shards[0].data)
        assert got[0] == size, "gloo: wrong sum"
        best = {m: float("inf") for m in METHODS}
        for block in range(args.blocks):
            k = block % len(METHODS)
            order = METHODS[k:] + METHODS[:k]
            for m in order:
                comm.Barrier()
                samples = []
                for _ in range(iters):
                    t0 = time.perf_counter()
                    ops[m]()
                    samples.append(time.perf_counter() - t0)
                best[m] = min(best[m], float(np.median(samples)))
        worst = {m: comm.allreduce(best[m], op=MPI.MAX) for m in METHODS}
        results.append({"bytes": nbytes, "seconds": worst})
        if rank == 0:
            print(f"  {nbytes} B done", file=sys.stderr, flush=True)
    jax.distributed.shutdown()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)


def bench_collectives(args, env, tmp):
    out = os.path.join(tmp, "collectives.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
           "--coordinator", f"127.0.0.1:{args.port}", "--blocks", str(args.blocks),
           "--sizes", *map(str, args.sizes)]
    args.runner(cmd, env, 1800)
    with open(out) as f:
        return json.load(f)


def bench_models(args, env, tmp):
    rows = []
    for model in args.models:
        spec = MODELS[model]
        steps = args.steps or (spec["quick_steps"] if args.quick else spec["steps"] // 4)
        warmup = 2 if args.quick else max(3, spec["warmup"] // 4)
        row = {"model": model, "steps": steps}
        for config in ("kd", "dp", "plain"):
            out = os.path.join(tmp, f"{model}.{config}.json")
            script = [sys.executable, os.path.join(HERE, "_jax_models.py"), config, model,
                      str(steps), str(warmup), out] + (["quick"] if args.quick else [])
            cenv = dict(env, BENCH_JAX_COORDINATOR=f"127.0.0.1:{args.port + 1}")
            args.runner(script, cenv, 1800, ranks=config != "plain")
            with open(out) as f:
                row[config] = json.load(f)["samples_per_s"]
        rows.append(row)
        print(f"  {model} done", file=sys.stderr, flush=True)
    return rows


def report(args, coll, models):
    n = args.np
    print(f"\nAllreduce (float32 sum of a jitted function's input), np={n}: time (us) "
          "and bus GB/s")
    print("| size | kerasdist jit us | kd donated us | gloo jit us | MPICH us | memcpy us | "
          "kd GB/s | gloo GB/s | MPICH GB/s | kd/gloo speed | kd/MPICH speed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in coll:
        s, b = r["seconds"], r["bytes"]
        print(f"| {b // KIB} KiB | {s['kerasdist'] * 1e6:.0f} | {s['kd donated'] * 1e6:.0f} | "
              f"{s['gloo'] * 1e6:.0f} | "
              f"{s['MPICH'] * 1e6:.0f} | {s['memcpy'] * 1e6:.0f} | "
              f"{busbw(b, s['kerasdist'], n):.2f} | {busbw(b, s['gloo'], n):.2f} | "
              f"{busbw(b, s['MPICH'], n):.2f} | {s['gloo'] / s['kerasdist']:.2f} | "
              f"{s['MPICH'] / s['kerasdist']:.2f} |")
    if models:
        print(f"\nKeras on JAX, train_on_batch samples/s (kd and DataParallel at np={n}, "
              "plain at np=1; XLA's default threads)")
        print("| model | kerasdist | DataParallel (gloo) | plain np=1 | kd/DP | kd/plain |")
        print("|---|---|---|---|---|---|")
        for r in models:
            print(f"| {r['model']} | {r['kd']:.0f} | {r['dp']:.0f} | {r['plain']:.0f} | "
                  f"{r['kd'] / r['dp']:.2f} | {r['kd'] / r['plain']:.2f} |")


def plot(path, args, coll, models):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if models else 1, figsize=(12 if models else 6, 4.5))
    axes = np.atleast_1d(axes)
    sizes = [r["bytes"] for r in coll]
    for m in ("kerasdist", "kd donated", "gloo", "MPICH"):
        axes[0].plot(sizes, [busbw(r["bytes"], r["seconds"][m], args.np) for r in coll],
                     marker="o", label=m)
    axes[0].set(xscale="log", xlabel="bytes", ylabel="bus GB/s",
                title=f"allreduce in jax.jit, np={args.np}")
    axes[0].legend()
    if models:
        xs = np.arange(len(models))
        for i, key in enumerate(("kd", "dp", "plain")):
            axes[1].bar(xs + (i - 1) * 0.27, [r[key] for r in models], 0.27, label=LABELS[key])
        axes[1].set_xticks(xs, [r["model"] for r in models])
        axes[1].set(ylabel="samples/s", title="Keras on JAX")
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--port", type=int, default=29631)
    p.add_argument("--sizes", nargs="+", default=None)
    p.add_argument("--models", nargs="*", default=["mnist", "resnet50", "embedding"])
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per model (default: a quarter of keras_synthetic's)")
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    p.add_argument("--quick", action="store_true", help="CI smoke test: tiny sizes, steps")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--coordinator", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.sizes = [int(s) for s in args.sizes]
        return collectives_worker(args)
    args.sizes = [parse_size(s) for s in args.sizes] if args.sizes else SIZES
    if args.quick:
        args.sizes, args.blocks = [4 * KIB, 64 * KIB], 1
        args.models = args.models[:1]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    started = time.time()
    args.runner = Runner(args.np)
    with tempfile.TemporaryDirectory() as tmp:
        coll = bench_collectives(args, env, tmp)
        models = bench_models(args, env, tmp) if args.models else []
    report(args, coll, models)
    record = {"benchmark": "jax_keras",
              "date": datetime.datetime.now().isoformat(timespec="seconds"), "np": args.np,
              "seconds": round(time.time() - started, 1), "collectives": coll,
              "models": models, "quick": args.quick}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    if args.png:
        plot(args.png, args, coll, models)


if __name__ == "__main__":
    main()
