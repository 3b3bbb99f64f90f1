"""Model-level benchmark: samples per second of Keras `model.fit` on synthetic
data, plain Keras against kerasdist, as Horovod's users judge it.

Run from the repository root (it starts every process itself):

    python benchmarks/keras_synthetic.py [--models mnist resnet50 embedding
        embedding_dense] [--steps N] [--warmup W] [--repeats R] [--quick]
        [--json PATH] [--png PATH] [--configs ...] [--run-timeout S]
        [--malloc default|tuned]

Models (per-rank batch in brackets):
- `mnist`: Horovod's Keras MNIST example CNN (conv32-conv64-maxpool-
  dropout-dense128-dropout-dense10) on 28x28x1 inputs, Adam [128].
- `resnet50`: `keras.applications.ResNet50(weights=None)` on 64x64x3 inputs
  with 10 classes, SGD with momentum as in Horovod's synthetic benchmark
  [16]. Its 23.6 M parameters (nearly all trainable) make a ~90 MiB
  gradient allreduce per step.
- `embedding`: `Embedding(100000, 64)` over 64 tokens per sample, average
  pooling, Dense(64, relu), Dense(10), Adam [128]. Its embedding gradient is
  a `tf.IndexedSlices` (checked in every run, see `grad_types` in the
  JSON), which `kerasdist.DistributedOptimizer` allgathers (values and
  indices) by default, as Horovod does; that is what this model uses.
- `embedding_dense`: the same model with `DistributedOptimizer(...,
  sparse_as_dense=True)` (Horovod's other option: a 25.6 MB dense allreduce
  instead of a ~4 MB allgather). Only np=2 differs from `embedding` (at one
  rank nothing is reduced); it is measured to show which option pays here.

Configurations, each a fresh process (or job), one after the other:
- `keras_np1_t2`: plain Keras, no kerasdist import, one `python` process with
  2 threads (`tf.config.threading` intra- and inter-op = 2, tf.data's private
  pool = 2): the baseline with the same total threads as np=2.
- `kd_np1_t2`: the same script with kerasdist (`hvd.init()`,
  `DistributedOptimizer`, `BroadcastGlobalVariablesCallback`) under
  `kerasdist-run -np 1`, 2 threads.
- `kd_np1_t1`: as above with 1 thread: the single-rank unit of np=2, the
  denominator of the scaling efficiency.
- `kd_np2_t1`: `kerasdist-run -np 2`, 1 thread per rank; the global batch
  is 2x the per-rank batch and samples/s counts both ranks.
- `keras_2x_t1`: two plain-Keras processes (no kerasdist) with 1 thread
  each, started together, each training on its own: data parallelism
  with no communication at all. Its samples/s (the sum of the two) is
  what np=2 could reach on these cores, so `kd np=2 / 2 procs` is the
  share of it kerasdist reaches, and `2 procs / Keras` tells how far above
  or below one two-threaded process that ceiling lies on this machine.

Training: `model.fit` over an infinite synthetic `tf.data` dataset
(`Dataset.from_tensors(batch).repeat()`: one random batch per rank, fixed,
as in Horovod's synthetic benchmark, so input costs nothing), one epoch of
`warmup + steps` steps, `verbose=0`, default `steps_per_execution=1`,
`jit_compile=False`. `fit` rather than `train_on_batch` because that is what
Horovod-style Keras scripts run (callbacks, the fit loop, the data iterator
inside the compiled step); `train_on_batch` would leave out the loop users
pay for.

Timing: a callback reads `time.perf_counter()` at every
`on_train_batch_end`; a step's time on a rank is the interval since the
previous batch end (so it includes the fit loop's own overhead). The first
`warmup` batches (tracing, first allocations) are dropped. For each
measured step the time is the maximum over ranks (the ranks are in
lock-step through the allreduce anyway); the reported figure is the median
of those, and samples/s = global batch / median step time. The mean over
the measured window is stored too (`samples_per_s_mean`). The timing
callback marks itself `_kerasdist_never_stops` (it never sets
`stop_training`), so kerasdist's `fit` guard adds no per-batch stop
check: the benchmark measures the training step, not that check.

Engine CPU: at the end of the warm-up and of the measured window, each rank
reads utime+stime of every thread (`/proc/self/task/<tid>/stat`, the thread
whose `comm` is `kd-engine` is kerasdist's engine) and of the process
(`/proc/self/stat`). engine CPU fraction = engine thread CPU / process CPU
over the measured steps, from clock ticks (10 ms: with the default step
counts a rank's window is thousands of ticks, its engine thread tens to
hundreds). The per-thread-name CPU breakdown (`tf_Compute` is TensorFlow's
pool, `python` the main thread) is in the JSON.

Derived figures per model: `kd np=2 / keras` = samples/s of `kd_np2_t1`
over `keras_np1_t2` (target >= 1.0); `2 procs / Keras` and `kd np=2 / 2
procs` against `keras_2x_t1`; scaling efficiency = samples/s of
`kd_np2_t1` / (2 x samples/s of `kd_np1_t1`) (1.0 = perfect).

Memory: `--malloc tuned` runs every process of every configuration with
glibc settings (`TUNED_MALLOC`: one arena, a fixed 32 MiB mmap threshold,
a 1 GiB trim threshold) under which the embedding models no longer switch
between a fast mode and one spent zeroing fresh pages; the default leaves
glibc as it is. The JSON records which was used.

Shared machines: each run records how many cores other processes used
during its measured window (`other_load_cores`: all CPUs' busy time from
/proc/stat minus this run's processes). A run above `--busy-cores` (0.3)
is contended; `--busy-retries K` runs it again (after `--busy-wait` s), up
to K times. `--repeats R` runs every configuration R times (rounds
interleaved, model by model). Of all runs of a configuration the fastest
uncontended one is kept (the fastest of all, marked `contended` and `*` in
the table, if none was quiet); every run's figures are in the JSON.

The machine is shared: run the full benchmark under
`flock /tmp/kerasdist-bench.lock`; the load average before and after every
run is recorded. `--quick` is a smoke test (few steps, small batches, and
by default only `mnist` and `embedding`); its numbers mean nothing.

Output: a markdown table on stdout, `benchmarks/results/keras_synthetic/keras_synthetic.json`
and `benchmarks/results/keras_synthetic/keras_synthetic.png` (or `--json`, `--png`).
"""

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _synthetic_cpu import cpu_delta, cpu_snapshot  # noqa: E402
from _synthetic_models import build_model, make_optimizer, synthetic_batch  # noqa: E402
from _synthetic_report import (combine, machine_info, plot, report_run,  # noqa: E402
                               summarize, table)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
BIN_DIR = os.path.dirname(sys.executable)

# name -> (kerasdist?, ranks, threads per rank, label)
CONFIGS = {
    "keras_np1_t2": (False, 1, 2, "Keras np=1 x2 thr"),
    "kd_np1_t2": (True, 1, 2, "kd np=1 x2 thr"),
    "kd_np1_t1": (True, 1, 1, "kd np=1 x1 thr"),
    "kd_np2_t1": (True, 2, 1, "kd np=2 x1 thr"),
    "keras_2x_t1": (False, 2, 1, "2 Keras procs x1 thr"),
}

# Per model: per-rank batch, measured steps, warm-up steps (full / quick).
MODELS = {
    "mnist": dict(batch=128, steps=200, warmup=20, quick_batch=32, quick_steps=8),
    "resnet50": dict(batch=16, steps=30, warmup=5, quick_batch=4, quick_steps=4,
                     image=64, quick_image=32),
    "embedding": dict(batch=128, steps=150, warmup=10, quick_batch=32, quick_steps=8,
                      vocab=100_000, seq=64, quick_vocab=20_000),
    "embedding_dense": dict(batch=128, steps=150, warmup=10, quick_batch=32,
                            quick_steps=8, vocab=100_000, seq=64, quick_vocab=20_000),
}
DEFAULT_MODELS = ["mnist", "resnet50", "embedding", "embedding_dense"]
# glibc settings that keep TensorFlow's large temporaries in one heap: with
# the defaults, tensors of tens of MB come and go in per-thread arenas' 64 MiB
# heaps and in mmap'd chunks, and a process can spend whole phases zeroing
# fresh pages (the embedding models' two modes, see the README).
TUNED_MALLOC = ("glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=33554432:"
                "glibc.malloc.trim_threshold=1073741824")
QUICK_MODELS = ["mnist", "embedding"]
QUICK_WARMUP = 2


def glibc_tunables(malloc):
    """The `GLIBC_TUNABLES` the workers run with: the caller's, then
    `TUNED_MALLOC` for `--malloc tuned` (later entries win), or None."""
    parts = (os.environ.get("GLIBC_TUNABLES"), TUNED_MALLOC if malloc == "tuned" else None)
    return ":".join(t for t in parts if t) or None


# ---------------------------------------------------------------- worker (one rank)

def worker(a):
    """One rank: trains `a.model` with fit and writes its timings as JSON."""
    import numpy as np
    import tensorflow as tf
    import keras

    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    rank, size = a.index, 1
    if a.kerasdist:
        import kerasdist as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    spec = MODELS[a.model]
    keras.utils.set_random_seed(1234)  # same initial weights everywhere
    model, shape = build_model(keras, a.model, spec, a.quick)
    opt = make_optimizer(keras, a.model, size)
    if a.kerasdist:
        opt = hvd.DistributedOptimizer(opt, sparse_as_dense=a.model == "embedding_dense")
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=False)
    x, y = synthetic_batch(np, a.model, spec, shape, a.batch, 100 + rank, a.quick)

    grad_types = None
    if a.model.startswith("embedding"):
        # What reaches DistributedOptimizer.apply(): the embedding's gradient type.
        with tf.GradientTape() as tape:
            loss = keras.losses.sparse_categorical_crossentropy(
                y[:4], model(x[:4], training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        grad_types = {v.path: type(g).__name__ for v, g in
                      zip(model.trainable_variables, grads)}

    options = tf.data.Options()
    options.threading.private_threadpool_size = a.threads
    options.threading.max_intra_op_parallelism = 1
    ds = tf.data.Dataset.from_tensors((x, y)).repeat().with_options(options)

    total = a.warmup + a.steps

    class StepTimer(keras.callbacks.Callback):
        # Its batch hook only reads clocks, never sets stop_training: so
        # kerasdist's fit guard needs no per-batch stop agreement for it.
        _kerasdist_never_stops = True

        def __init__(self):
            super().__init__()
            self.ends, self.cpu0, self.cpu1 = [], None, None

        def on_train_begin(self, logs=None):
            self.begin = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())
            if len(self.ends) == a.warmup:
                if a.peers > 1:
                    # Independent processes start their measured windows
                    # together; the window starts after the wait.
                    wait_for_peers(a.out, a.index, a.peers, a.run_timeout)
                    self.ends[-1] = time.perf_counter()
                self.wall0 = time.time()
                self.cpu0 = cpu_snapshot()
            elif len(self.ends) == total:
                self.wall1 = time.time()
                self.cpu1 = cpu_snapshot()

    timer = StepTimer()
    callbacks = [timer]
    if a.kerasdist:
        callbacks.insert(0, hvd.callbacks.BroadcastGlobalVariablesCallback(0))
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    history = model.fit(ds, steps_per_epoch=total, epochs=1, verbose=0,
                        callbacks=callbacks)
    fit_s = time.perf_counter() - t0
    ends = timer.ends
    steps = [ends[i] - ends[i - 1] for i in range(a.warmup, total)]
    out = {
        "rank": rank, "size": size, "threads": a.threads, "kerasdist": a.kerasdist,
        "batch": a.batch, "warmup": a.warmup, "steps": a.steps,
        "step_s": steps, "window_s": ends[-1] - ends[a.warmup - 1],
        "first_batch_s": ends[0] - timer.begin, "fit_s": fit_s,
        "loss": float(history.history["loss"][-1]),
        "params": int(model.count_params()),
        "cpu": cpu_delta(timer.cpu0, timer.cpu1),
        "loadavg_before": load0, "loadavg_after": os.getloadavg(),
        "grad_types": grad_types, "window_wall": [timer.wall0, timer.wall1],
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
    }
    if a.kerasdist:
        out["transport"] = hvd.transport_info() if size > 1 else None
    path = f"{a.out}.rank{rank}.json"
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)
    if a.kerasdist:
        hvd.shutdown()


def wait_for_peers(out, index, peers, timeout):
    """Marks this process ready and waits (bounded) until all peers are."""
    with open(f"{out}.ready{index}", "w"):
        pass
    deadline = time.time() + timeout
    while not all(os.path.exists(f"{out}.ready{i}") for i in range(peers)):
        if time.time() > deadline:
            raise RuntimeError(f"process {index}: the other independent processes did not "
                               f"finish their warm-up within {timeout:.0f} s")
        time.sleep(0.005)


# ---------------------------------------------------------------- orchestrator

def launcher(np_):
    tool = os.path.join(BIN_DIR, "kerasdist-run")
    if os.path.exists(tool):
        return [tool, "-np", str(np_)]
    return [sys.executable, "-m", "kerasdist.runner", "-np", str(np_)]


def run_all(cmds, logs, env, timeout):
    """Runs the commands side by side; 0, the first failing exit code, or a
    timeout message. A failure or the timeout stops the others; nothing is
    left running, also if this process is interrupted."""
    procs, rc = [], 0
    try:
        for c, path in zip(cmds, logs):
            with open(path, "w") as log:
                procs.append(subprocess.Popen(c, stdout=log, stderr=subprocess.STDOUT,
                                              env=env, cwd=ROOT, start_new_session=True))
        deadline = time.time() + timeout
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed:
                rc = failed[0]
                break
            if time.time() > deadline:
                rc = f"timeout after {timeout} s"
                break
            time.sleep(0.2)
        if rc == 0:
            rc = next((p.returncode for p in procs if p.returncode), 0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()  # kerasdist-run forwards it to the ranks
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    return rc


def run_config(model, config, a, workdir):
    """Runs one (model, config); returns its combined record."""
    use_kd, np_, threads, _ = CONFIGS[config]
    spec = MODELS[model]
    batch = spec["quick_batch"] if a.quick else spec["batch"]
    steps = a.steps or (spec["quick_steps"] if a.quick else spec["steps"])
    warmup = a.warmup or (QUICK_WARMUP if a.quick else spec["warmup"])
    os.makedirs(workdir, exist_ok=True)
    out = os.path.join(workdir, f"{model}.{config}")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model,
           "--threads", str(threads), "--batch", str(batch), "--steps", str(steps),
           "--warmup", str(warmup), "--out", out]
    if a.quick:
        cmd.append("--quick")
    if use_kd:
        cmds = [launcher(np_) + cmd + ["--kerasdist"]]
    else:  # np_ independent processes side by side (no communication)
        cmds = [cmd + ["--index", str(i), "--peers", str(np_),
                       "--run-timeout", str(a.run_timeout)] for i in range(np_)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    if a.malloc == "tuned":
        env["GLIBC_TUNABLES"] = glibc_tunables(a.malloc)
    record = {"config": config, "kerasdist": use_kd, "np": np_, "threads": threads,
              "batch_per_rank": batch, "global_batch": batch * np_, "steps": steps,
              "warmup": warmup, "independent": not use_kd and np_ > 1,
              "loadavg_start": os.getloadavg()}
    t0 = time.time()
    logs = [f"{out}.{i}.log" for i in range(len(cmds))]
    rc = run_all(cmds, logs, env, a.run_timeout)
    record["wall_s"] = time.time() - t0
    record["loadavg_end"] = os.getloadavg()
    ranks = []
    for r in range(np_):
        try:
            with open(f"{out}.rank{r}.json") as f:
                ranks.append(json.load(f))
        except OSError:
            pass
    if rc != 0 or len(ranks) != np_:
        tail = ""
        for path in logs:
            with open(path) as f:
                tail += f"--- {os.path.basename(path)}\n" + f.read()[-3000 // len(logs):]
        record["error"] = f"exit {rc}, {len(ranks)}/{np_} rank results; output:\n{tail}"
        return record
    combine(record, ranks)
    return record


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=list(MODELS),
                   help=f"default: {' '.join(DEFAULT_MODELS)} ({' '.join(QUICK_MODELS)} "
                        "with --quick)")
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    p.add_argument("--steps", type=int, help="measured steps per run (default: per model)")
    p.add_argument("--warmup", type=int, help="warm-up steps per run, >= 1 (default: per model)")
    p.add_argument("--quick", action="store_true", help="tiny smoke run; numbers mean nothing")
    # Default outputs go to results/local/ (not committed), so that a run
    # never overwrites a recorded one.
    p.add_argument("--json", default=os.path.join(RESULTS, "local", "keras_synthetic.json"))
    p.add_argument("--png", default=os.path.join(RESULTS, "local", "keras_synthetic.png"))
    p.add_argument("--repeats", type=int, default=1,
                   help="run every config this many times (rounds interleaved), keep the "
                        "fastest; all are in the JSON (default 1)")
    p.add_argument("--busy-cores", type=float, default=0.3,
                   help="a run during whose window other processes used more cores than "
                        "this counts as contended (default 0.3)")
    p.add_argument("--busy-retries", type=int, default=0,
                   help="run a contended run again, up to this many times (default 0)")
    p.add_argument("--busy-wait", type=float, default=15.0,
                   help="seconds to wait before such a retry (default 15)")
    p.add_argument("--run-timeout", type=float, help="seconds per run (default 900, quick 180)")
    p.add_argument("--malloc", choices=("default", "tuned"), default="default",
                   help="'tuned' runs every process of every configuration with "
                        f"GLIBC_TUNABLES={TUNED_MALLOC} (see the README)")
    # Worker mode (one rank), used by the orchestrator.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--kerasdist", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--peers", type=int, default=1, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.warmup is not None and a.warmup < 1:
        p.error("--warmup must be >= 1 (the first batch includes tracing)")
    if a.steps is not None and a.steps < 1:
        p.error("--steps must be >= 1")
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    if a.busy_retries < 0:
        p.error("--busy-retries must be >= 0")
    if a.run_timeout is None:
        a.run_timeout = 180.0 if a.quick else 900.0
    models = a.models or (QUICK_MODELS if a.quick else DEFAULT_MODELS)

    started = datetime.datetime.now(datetime.timezone.utc)
    info = machine_info()
    print(f"kerasdist Keras synthetic benchmark, {started:%Y-%m-%d %H:%M} UTC on "
          f"{info['hostname']} ({info.get('cpu', '?')}, {info['cpus']} CPUs)", flush=True)
    results, failed = {}, []
    with tempfile.TemporaryDirectory(prefix="kd-synth-") as workdir:
        for model in models:
            runs = {c: [] for c in a.configs}
            for rep in range(a.repeats):
                for config in a.configs:
                    for attempt in range(1 + a.busy_retries):
                        rec = run_config(model, config, a,
                                         os.path.join(workdir, f"r{rep}.{attempt}"))
                        runs[config].append(rec)
                        report_run(model, config, rec)
                        if "error" in rec or rec["other_load_cores"] <= a.busy_cores:
                            break
                        if attempt < a.busy_retries:
                            print(f"    (other processes used {rec['other_load_cores']:.2f} "
                                  f"cores > {a.busy_cores}: running it again)", flush=True)
                            time.sleep(a.busy_wait)
            results[model] = {}
            for config, recs in runs.items():
                ok = [r for r in recs if "error" not in r]
                if not ok:
                    failed.append(f"{model}/{config}")
                quiet = [r for r in ok if r["other_load_cores"] <= a.busy_cores]
                best = max(quiet or ok, key=lambda r: r["samples_per_s"]) if ok else recs[-1]
                results[model][config] = dict(best, contended=bool(ok) and not quiet, runs=[{
                    k: r.get(k) for k in ("samples_per_s", "median_step_s",
                                          "other_load_cores", "engine_cpu_fraction",
                                          "error")} for r in recs])
    summary = summarize(results)
    text = table(results, summary, {c: CONFIGS[c] for c in a.configs})
    if any(r.get("contended") for m in results.values() for r in m.values()):
        text += (f"\n\n\\* contended: other processes used more than {a.busy_cores} "
                 "cores during every run of this configuration.")
    print("\n" + text)
    doc = {
        "benchmark": "keras_synthetic", "date": started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": info,
        "config": {"models": models, "configs": {c: dict(zip(
            ("kerasdist", "np", "threads_per_rank", "label"), CONFIGS[c])) for c in a.configs},
            "model_specs": {m: MODELS[m] for m in models}, "quick": a.quick,
            "steps": a.steps, "warmup": a.warmup, "repeats": a.repeats,
            "busy_cores": a.busy_cores, "busy_retries": a.busy_retries,
            "malloc": a.malloc, "glibc_tunables": glibc_tunables(a.malloc),
            "timing": (
                "fit over Dataset.from_tensors(batch).repeat(); step = interval between "
                "on_train_batch_end calls after the warm-up, max over ranks, median; "
                "independent processes (keras_2x_t1) start their windows together and "
                "their samples/s is the sum of each one's batch / own median step"),
            "argv": sys.argv[1:]},
        "results": results, "summary": summary, "table": text, "failed": failed,
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)
    if a.png:
        os.makedirs(os.path.dirname(os.path.abspath(a.png)), exist_ok=True)
        plot(results, summary, a.png, {c: CONFIGS[c] for c in a.configs})
    print(f"\nwrote {a.json}" + (f" and {a.png}" if a.png else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
