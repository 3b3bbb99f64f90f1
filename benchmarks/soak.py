"""Long soak and long fit: throughput and resident memory over time.

    kerasdist-run -np 3 python benchmarks/soak.py --ops 100000 [--seed S]
        [--fit-steps 3000] [--fit-eager] [--json PATH]

Part 1 runs the randomized soak of tests/mp/soak.py (every result checked
against numpy; a wrong value stops the run with the seed and step) for
`--ops` collectives and reports ops/s and each rank's RSS (VmRSS from
/proc/self/status) at the start, after every 10% of the ops and at the end.

Part 2 ("long fit") trains a tiny Keras model for `--fit-steps` steps with
`DistributedOptimizer`, `BroadcastGlobalVariablesCallback` and
`MetricAverageCallback` (10 epochs, compiled step unless `--fit-eager`) and
samples RSS at the start, every 10% of the steps and at the end, to show
that memory stays flat over a long fit.

Known: every eager collective with a new name (every unnamed eager call
too) grows RSS by ~36 KiB for good (TensorFlow's eager kernel cache keys on
the `tensor_name` attr; tests/mp/eager_name_rss.py). The soak's plan has
many such calls, so its RSS grows. `--bounded-names N` renames them to N
names per kind; a name still meets many dtype/op/scale combinations, each
another cached kernel, so RSS grows less but is not flat (20,000 ops, N=64:
about 16 KiB/op). The long fit (fixed names) is flat. `--fit-steps 0` skips it, `--ops 0`
skips the soak.

Rank 0 prints a summary and writes JSON (default
benchmarks/results/soak_np<N>.json).
"""

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "mp"))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist as kd  # noqa: E402
import soak  # noqa: E402  (tests/mp/soak.py)


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def log(*args):
    sys.stdout.write(" ".join(str(a) for a in args) + "\n")
    sys.stdout.flush()


def run_soak(seed, n_ops, bounded_names=None):
    samples = []
    marks = [n_ops * k // 10 for k in range(1, 10)]

    def progress(done):
        while marks and done >= marks[0]:
            marks.pop(0)
            samples.append((done, rss_kib(), time.perf_counter() - t0))
            if kd.rank() == 0:
                log(f"soak {done}/{n_ops} ops, {samples[-1][2]:.0f} s, rank 0 RSS "
                    f"{samples[-1][1] / 1024:.1f} MiB")

    runner = soak.Soak(seed, n_ops, progress=progress, log=log, bounded_names=bounded_names)
    t0 = time.perf_counter()
    samples.append((0, rss_kib(), 0.0))
    stats = runner.run()
    samples.append((stats["ops"], rss_kib(), time.perf_counter() - t0))
    stats["rss_kib"] = samples
    return stats


class RssSampler(keras.callbacks.Callback):
    """Samples RSS at the start and every `every` training batches."""

    def __init__(self, every):
        super().__init__()
        self.every, self.step, self.samples = every, 0, []

    def on_train_begin(self, logs=None):
        self.t0 = time.perf_counter()
        self.samples.append((0, rss_kib(), 0.0))

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step % self.every == 0:
            self.samples.append((self.step, rss_kib(), time.perf_counter() - self.t0))


def run_fit(steps, eager):
    epochs = 10 if steps >= 10 else 1
    per_epoch = max(steps // epochs, 1)
    rng = np.random.default_rng(kd.rank())
    x = rng.standard_normal((256, 8)).astype(np.float32)
    y = (x @ np.arange(1, 9, dtype=np.float32) / 8.0)[:, None]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    opt = kd.DistributedOptimizer(keras.optimizers.SGD(kd.scale_learning_rate(0.01)))
    model.compile(optimizer=opt, loss="mse", metrics=["mae"], run_eagerly=eager)
    sampler = RssSampler(max(epochs * per_epoch // 10, 1))
    t0 = time.perf_counter()
    hist = model.fit(ds, epochs=epochs, steps_per_epoch=per_epoch, verbose=0,
                     callbacks=[kd.callbacks.BroadcastGlobalVariablesCallback(0),
                                kd.callbacks.MetricAverageCallback(), sampler])
    seconds = time.perf_counter() - t0
    samples = sampler.samples + [(epochs * per_epoch, rss_kib(), seconds)]
    return dict(steps=epochs * per_epoch, epochs=epochs, eager=eager, seconds=seconds,
                steps_per_second=epochs * per_epoch / seconds,
                final_loss=float(hist.history["loss"][-1]), rss_kib=samples)


def summarize(name, per_rank, unit):
    """Lines with each rank's RSS at start, first 10% mark and end."""
    lines = []
    for r, samples in enumerate(per_rank):
        start, first, end = samples[0][1], samples[1][1], samples[-1][1]
        lines.append(f"  {name} rank {r}: RSS start {start / 1024:.1f} MiB, at "
                     f"{samples[1][0]} {unit} {first / 1024:.1f} MiB, end {end / 1024:.1f} MiB "
                     f"(end - start {(end - start) / 1024:+.1f} MiB, end - 10% mark "
                     f"{(end - first) / 1024:+.1f} MiB)")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=100000)
    p.add_argument("--seed", type=int, default=None, help="default: $KD_SOAK_SEED or random")
    p.add_argument("--bounded-names", type=int, default=None, metavar="N",
                   help="rename fresh/unnamed eager collectives to N names per kind "
                        "(each new eager name grows RSS by ~36 KiB, see "
                        "tests/mp/eager_name_rss.py)")
    p.add_argument("--fit-steps", type=int, default=3000)
    p.add_argument("--fit-eager", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    kd.init()
    size, rank = kd.size(), kd.rank()
    seed = soak.resolve_seed(args.seed)
    result = dict(benchmark="soak", np=size, seed=seed,
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  host=socket.gethostname(), cpus=os.cpu_count(), python=platform.python_version(),
                  tensorflow=tf.__version__, env={k: v for k, v in os.environ.items()
                                                  if k.startswith("KERASDIST_")})
    if args.ops > 0:
        if rank == 0:
            log(f"soak: seed={seed} ops={args.ops} np={size}")
        stats = run_soak(seed, args.ops, args.bounded_names)
        every = kd.allgather_object(stats)
        result["soak"] = dict(
            ops=stats["ops"], steps=stats["steps"], bounded_names=args.bounded_names,
            seconds=max(s["seconds"] for s in every),
            ops_per_second=stats["ops"] / max(s["seconds"] for s in every),
            ops_by_step_kind=stats["ops_by_step_kind"],
            rss_kib_per_rank=[s["rss_kib"] for s in every])
    if args.fit_steps > 0:
        fit = run_fit(args.fit_steps, args.fit_eager)
        every = kd.allgather_object(fit)
        result["fit"] = dict({k: v for k, v in fit.items() if k != "rss_kib"},
                             seconds=max(f["seconds"] for f in every),
                             rss_kib_per_rank=[f["rss_kib"] for f in every])
    if rank == 0:
        lines = [f"np={size} seed={seed}"]
        if "soak" in result:
            s = result["soak"]
            lines.append(f"soak: {s['ops']} ops in {s['seconds']:.1f} s = "
                         f"{s['ops_per_second']:.0f} ops/s, all results correct")
            lines += summarize("soak", s["rss_kib_per_rank"], "ops")
        if "fit" in result:
            f = result["fit"]
            lines.append(f"fit: {f['steps']} steps ({f['epochs']} epochs, "
                         f"{'eager' if f['eager'] else 'tf.function'}) in {f['seconds']:.1f} s, "
                         f"final loss {f['final_loss']:.4f}")
            lines += summarize("fit", f["rss_kib_per_rank"], "steps")
        log("\n".join(lines))
        path = args.json or os.path.join(HERE, "results", f"soak_np{size}.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(result, fh, indent=1)
        log(f"wrote {path}")


if __name__ == "__main__":
    main()
