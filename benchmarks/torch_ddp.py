"""PyTorch benchmark: kerasdist.torch against DDP over gloo and MPICH.

    python benchmarks/torch_ddp.py [--np 2] [--cluster 2x2 [--rate 10gbit]]
        [--sizes 4K 64K 1M 16M 64M] [--models mnist mlp resnet] [--steps 60]
        [--json PATH] [--png PATH] [--quick]

Two levels, every configuration of a layout in one run:
- collectives (one mpiexec job, all methods interleaved per size): in-place
  float32 sums with `kerasdist.torch.allreduce_`, `torch.distributed.
  all_reduce` over gloo, MPICH's `MPI_Allreduce` (mpi4py) and a local
  memcpy. Per size, blocks rotate the methods' order; a rank's time is its
  smallest block median, the reported time the largest over ranks. Bus
  bandwidth is `bytes * 2(N-1)/N / time`.
- models (benchmarks/_torch_models.py, one job per configuration): samples/s
  of Adam steps, 128 examples per rank, one thread per rank, for
  kerasdist.torch's DistributedOptimizer and DDP over gloo at np=N, and
  plain PyTorch in one process with every core.

It prints the tables, writes JSON and, with --png, a plot. `--cluster 2x2`
(as root) runs the np=4 jobs on 2 namespaced test hosts of 2 ranks each
(tests/hosts.py), their links shaped with `--rate`; gloo then listens on
the first host's namespaced address, otherwise on 127.0.0.1. Plain PyTorch
runs on this machine, outside the namespaces.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
KIB, MIB = 1024, 1024 * 1024
SIZES = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
METHODS = ("kerasdist", "gloo", "MPICH", "memcpy")


def parse_size(text):
    t = text.upper().removesuffix("B").removesuffix("I")
    mult = {"K": KIB, "M": MIB}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def collectives_worker(args):
    """One rank of the collectives job (under mpiexec)."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import kerasdist.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    comm, rank, size = MPI.COMM_WORLD, hvd.rank(), hvd.size()
    dist.init_process_group("gloo", init_method=args.gloo_init, rank=rank, world_size=size)
    results = []
    for nbytes in args.sizes:
        n = nbytes // 4
        x = torch.ones(n)
        src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
        iters = max(3, min(200, int(64 * MIB / max(nbytes, 1) // 4) + 3))
        ops = {
            "kerasdist": lambda: hvd.allreduce_(x, op=hvd.Sum, name="bench"),
            "gloo": lambda: dist.all_reduce(x),
            "MPICH": lambda: comm.Allreduce(src, dst, op=MPI.SUM),
            "memcpy": lambda: np.copyto(dst, src),
        }
        want = float(size)
        x.fill_(1.0)
        hvd.allreduce_(x, op=hvd.Sum, name="bench")
        assert float(x[0]) == want and float(x[-1]) == want, "kerasdist: wrong sum"
        best = {m: float("inf") for m in METHODS}
        for block in range(args.blocks):
            order = METHODS[block % 4:] + METHODS[:block % 4]
            for m in order:
                comm.Barrier()
                samples = []
                for _ in range(iters):
                    x.fill_(1.0)
                    t0 = time.perf_counter()
                    ops[m]()
                    samples.append(time.perf_counter() - t0)
                best[m] = min(best[m], float(np.median(samples)))
        worst = {m: comm.allreduce(best[m], op=MPI.MAX) for m in METHODS}
        results.append({"bytes": nbytes, "seconds": worst})
        if rank == 0:
            print(f"  {nbytes} B done", file=sys.stderr, flush=True)
    dist.destroy_process_group()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)


class Runner:
    """Runs a job on `np` ranks: under this machine's mpiexec, or across
    the namespaced hosts of `cluster` (tests/hosts.Cluster)."""

    def __init__(self, np_, cluster=None, slots=None):
        self.np, self.cluster, self.slots = np_, cluster, slots

    def __call__(self, argv, env, timeout, ranks=True):
        if self.cluster is not None and ranks:
            extra = {k: v for k, v in env.items() if k.startswith(("BENCH_", "PYTHON"))}
            result = self.cluster.mpirun(argv, self.slots, timeout=timeout, env=extra,
                                         cwd=os.path.dirname(HERE))
            self.cluster.kill_jobs()
            if not result.ok:
                raise RuntimeError(result.describe())
            return
        cmd = ([os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(self.np)]
               if ranks else []) + argv
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def bench_collectives(args, env, tmp):
    out = os.path.join(tmp, "collectives.json")
    cmd = [
        sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
        "--gloo-init", f"tcp://{args.gloo_addr}:{args.port}", "--blocks", str(args.blocks),
        "--sizes", *map(str, args.sizes)]
    args.runner(cmd, env, 1800)
    with open(out) as f:
        return json.load(f)


def bench_models(args, env, tmp):
    rows = []
    for model in args.models:
        row = {"model": model}
        for config in ("kd", "ddp", "plain"):
            out = os.path.join(tmp, f"{model}.{config}.json")
            script = [sys.executable, os.path.join(HERE, "_torch_models.py"), config, model,
                      str(args.steps), str(args.batch), out]
            cenv = dict(env, BENCH_GLOO_ADDR=f"tcp://{args.gloo_addr}:{args.port + 1}")
            if config == "plain":
                cenv["BENCH_THREADS"] = str(os.cpu_count())
            args.runner(script, cenv, 1800, ranks=config != "plain")
            with open(out) as f:
                row[config] = json.load(f)["samples_per_s"]
        rows.append(row)
        print(f"  {model} done", file=sys.stderr, flush=True)
    return rows


def busbw(nbytes, seconds, n):
    return nbytes * 2 * (n - 1) / n / seconds / 1e9


def report(args, coll, models):
    n = args.np
    print(f"\nAllreduce (float32 sum, in place), np={n} {args.layout}: time (us) and "
          "bus GB/s")
    print("| size | kerasdist us | gloo us | MPICH us | memcpy us | kd GB/s | gloo GB/s "
          "| MPICH GB/s | kd/gloo speed | kd/MPICH speed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in coll:
        s, b = r["seconds"], r["bytes"]
        print(f"| {b // KIB} KiB | {s['kerasdist'] * 1e6:.0f} | {s['gloo'] * 1e6:.0f} | "
              f"{s['MPICH'] * 1e6:.0f} | {s['memcpy'] * 1e6:.0f} | "
              f"{busbw(b, s['kerasdist'], n):.2f} | {busbw(b, s['gloo'], n):.2f} | "
              f"{busbw(b, s['MPICH'], n):.2f} | {s['gloo'] / s['kerasdist']:.2f} | "
              f"{s['MPICH'] / s['kerasdist']:.2f} |")
    if models:
        print(f"\nModels (Adam, {args.batch} per rank, samples/s; kd and DDP at np={n} "
              "with 1 thread per rank, plain at np=1 with every core)")
        print("| model | kerasdist | DDP (gloo) | plain np=1 | kd/DDP | kd/plain |")
        print("|---|---|---|---|---|---|")
        for r in models:
            print(f"| {r['model']} | {r['kd']:.0f} | {r['ddp']:.0f} | {r['plain']:.0f} | "
                  f"{r['kd'] / r['ddp']:.2f} | {r['kd'] / r['plain']:.2f} |")


def plot(path, args, coll, models):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if models else 1, figsize=(12 if models else 6, 4.5))
    axes = np.atleast_1d(axes)
    sizes = [r["bytes"] for r in coll]
    for m in ("kerasdist", "gloo", "MPICH"):
        axes[0].plot(sizes, [busbw(r["bytes"], r["seconds"][m], args.np) for r in coll],
                     marker="o", label=m)
    axes[0].set(xscale="log", xlabel="bytes", ylabel="bus GB/s",
                title=f"allreduce, np={args.np}")
    axes[0].legend()
    if models:
        xs = np.arange(len(models))
        for i, (key, label) in enumerate((("kd", "kerasdist"), ("ddp", "DDP gloo"),
                                          ("plain", "plain np=1"))):
            axes[1].bar(xs + (i - 1) * 0.27, [r[key] for r in models], 0.27, label=label)
        axes[1].set_xticks(xs, [r["model"] for r in models])
        axes[1].set(ylabel="samples/s", title="models")
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--cluster", default=None, choices=["2x2"],
                   help="namespaced test hosts (root); default: this machine")
    p.add_argument("--rate", default=None, help="link shaping with --cluster, e.g. 10gbit")
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--sizes", nargs="+", default=None)
    p.add_argument("--models", nargs="*", default=["mnist", "mlp", "resnet"])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    p.add_argument("--quick", action="store_true", help="CI smoke test: tiny sizes, steps")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--gloo-init", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.sizes = [int(s) for s in args.sizes]
        return collectives_worker(args)
    args.sizes = [parse_size(s) for s in args.sizes] if args.sizes else SIZES
    if args.quick:
        args.sizes, args.steps, args.blocks = [4 * KIB, 64 * KIB], 6, 1
        args.models = args.models[:1]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    started = time.time()
    cluster = None
    args.gloo_addr, args.layout = "127.0.0.1", "one host"
    if args.cluster:
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
        import hosts

        cluster = hosts.Cluster(2, rate=args.rate)
        args.np, args.gloo_addr = 4, cluster.hosts[0].address
        args.layout = f"2x2 hosts, links {args.rate or 'unshaped'}"
    args.runner = Runner(args.np, cluster, [2, 2])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            coll = bench_collectives(args, env, tmp)
            models = bench_models(args, env, tmp) if args.models else []
    finally:
        if cluster is not None:
            cluster.close()
    report(args, coll, models)
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "np": args.np, "layout": args.layout, "batch": args.batch, "steps": args.steps,
              "seconds": round(time.time() - started, 1), "collectives": coll,
              "models": models}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    if args.png:
        plot(args.png, args, coll, models)


if __name__ == "__main__":
    main()
