"""Model-level benchmark: samples per second of Keras `model.fit` on synthetic
data, plain Keras against kerasdist, as Horovod's users judge it.

Run from the repository root (it starts every process itself):

    python benchmarks/keras_synthetic.py [--models mnist resnet50 embedding
        embedding_dense] [--steps N] [--warmup W] [--repeats R] [--quick]
        [--json PATH] [--png PATH] [--configs ...] [--run-timeout S]

Models (per-rank batch in brackets):
- `mnist`: Horovod's Keras MNIST example CNN (conv32-conv64-maxpool-
  dropout-dense128-dropout-dense10) on 28x28x1 inputs, Adam [128].
- `resnet50`: `keras.applications.ResNet50(weights=None)` on 64x64x3 inputs
  with 10 classes, SGD with momentum as in Horovod's synthetic benchmark
  [16]. Its 25.6 M parameters make a ~94 MiB gradient allreduce per step.
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
over `keras_np1_t2` (target >= 1.0); scaling efficiency = samples/s of
`kd_np2_t1` / (2 x samples/s of `kd_np1_t1`) (1.0 = perfect).

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

Output: a markdown table on stdout, `benchmarks/results/keras_synthetic.json`
and `benchmarks/results/keras_synthetic.png` (or `--json`, `--png`).
"""

import argparse
import datetime
import json
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

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
QUICK_MODELS = ["mnist", "embedding"]
QUICK_WARMUP = 2
CLASSES = 10


# ---------------------------------------------------------------- /proc reading

def _stat_ticks(path):
    """utime + stime (clock ticks) and comm-free fields of a /proc stat file."""
    with open(path) as f:
        text = f.read()
    fields = text[text.rindex(")") + 2:].split()  # fields[0] is field 3 (state)
    return int(fields[11]) + int(fields[12])


def cpu_snapshot():
    """Process CPU ticks and per-thread (tid -> (comm, ticks))."""
    threads = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
            threads[tid] = (comm, _stat_ticks(f"/proc/self/task/{tid}/stat"))
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return {"process": _stat_ticks("/proc/self/stat"), "threads": threads,
            "machine_busy": machine_busy_ticks()}


def machine_busy_ticks():
    """Busy clock ticks of all CPUs (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4]


def cpu_delta(before, after):
    """CPU seconds over the window: process, engine thread, by thread name."""
    hz = os.sysconf("SC_CLK_TCK")
    by_name, engine, engine_threads = {}, 0, 0
    for tid, (comm, ticks) in after["threads"].items():
        start = before["threads"].get(tid, (comm, 0))[1]
        by_name[comm] = by_name.get(comm, 0) + (ticks - start)
        if comm == "kd-engine":
            engine += ticks - start
            engine_threads += 1
    return {
        "process_cpu_s": (after["process"] - before["process"]) / hz,
        "machine_busy_s": (after["machine_busy"] - before["machine_busy"]) / hz,
        "engine_cpu_s": engine / hz if engine_threads else None,
        "engine_threads": engine_threads,
        "threads_cpu_s": {k: v / hz for k, v in sorted(by_name.items(),
                                                       key=lambda kv: -kv[1]) if v},
    }


# ---------------------------------------------------------------- worker (one rank)

def build_model(keras, name, spec, quick):
    layers = keras.layers
    if name == "mnist":
        return keras.Sequential([
            keras.Input((28, 28, 1)),
            layers.Conv2D(32, kernel_size=3, activation="relu"),
            layers.Conv2D(64, kernel_size=3, activation="relu"),
            layers.MaxPooling2D(pool_size=2),
            layers.Dropout(0.25),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(CLASSES, activation="softmax"),
        ]), (28, 28, 1)
    if name == "resnet50":
        size = spec["quick_image" if quick else "image"]
        shape = (size, size, 3)
        return keras.applications.ResNet50(weights=None, input_shape=shape,
                                           classes=CLASSES), shape
    if name.startswith("embedding"):
        vocab = spec["quick_vocab" if quick else "vocab"]
        return keras.Sequential([
            keras.Input((spec["seq"],), dtype="int32"),
            layers.Embedding(vocab, 64),
            layers.GlobalAveragePooling1D(),
            layers.Dense(64, activation="relu"),
            layers.Dense(CLASSES, activation="softmax"),
        ]), (spec["seq"],)
    raise ValueError(f"unknown model {name!r}")


def make_optimizer(keras, name, lr_scale):
    if name == "resnet50":  # Horovod's synthetic benchmark: SGD
        return keras.optimizers.SGD(0.01 * lr_scale, momentum=0.9)
    return keras.optimizers.Adam(0.001 * lr_scale)


def synthetic_batch(np, name, spec, shape, batch, seed, quick):
    rng = np.random.default_rng(seed)
    if name.startswith("embedding"):
        vocab = spec["quick_vocab" if quick else "vocab"]
        x = rng.integers(0, vocab, size=(batch,) + shape, dtype=np.int32)
    else:
        x = rng.standard_normal((batch,) + shape, dtype=np.float32)
    y = rng.integers(0, CLASSES, size=(batch,), dtype=np.int32)
    return x, y


def worker(a):
    """One rank: trains `a.model` with fit and writes its timings as JSON."""
    import numpy as np
    import tensorflow as tf
    import keras

    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    rank, size = 0, 1
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
                self.cpu0 = cpu_snapshot()
            elif len(self.ends) == total:
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
        "grad_types": grad_types,
    }
    if a.kerasdist:
        out["transport"] = hvd.runtime.transport_info() if size > 1 else None
    path = f"{a.out}.rank{rank}.json"
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)
    if a.kerasdist:
        hvd.shutdown()


# ---------------------------------------------------------------- orchestrator

def launcher(np_):
    tool = os.path.join(BIN_DIR, "kerasdist-run")
    if os.path.exists(tool):
        return [tool, "-np", str(np_)]
    return [sys.executable, "-m", "kerasdist.runner", "-np", str(np_)]


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
        cmd = launcher(np_) + cmd + ["--kerasdist"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    record = {"config": config, "kerasdist": use_kd, "np": np_, "threads": threads,
              "batch_per_rank": batch, "global_batch": batch * np_, "steps": steps,
              "warmup": warmup, "loadavg_start": os.getloadavg()}
    t0 = time.time()
    log_path = out + ".log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT, start_new_session=True)
        try:
            rc = proc.wait(timeout=a.run_timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # kerasdist-run forwards it to the ranks
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = f"timeout after {a.run_timeout} s"
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
        with open(log_path) as f:
            tail = f.read()[-3000:]
        record["error"] = f"exit {rc}, {len(ranks)}/{np_} rank results; output:\n{tail}"
        return record
    combine(record, ranks)
    return record


def combine(record, ranks):
    """Per-step max over ranks, median, samples/s and CPU figures."""
    per_step = [max(r["step_s"][i] for r in ranks) for i in range(len(ranks[0]["step_s"]))]
    median = statistics.median(per_step)
    window = max(r["window_s"] for r in ranks)
    gb = record["global_batch"]
    record.update(
        median_step_s=median,
        p10_step_s=_quantile(per_step, 0.1), p90_step_s=_quantile(per_step, 0.9),
        samples_per_s=gb / median,
        samples_per_s_mean=gb * len(per_step) / window,
        first_batch_s=max(r["first_batch_s"] for r in ranks),
        params=ranks[0]["params"], loss=[r["loss"] for r in ranks],
        grad_types=ranks[0]["grad_types"], transport=ranks[0].get("transport"),
    )
    cpu = []
    n = len(per_step)
    for r in ranks:
        c = dict(r["cpu"], rank=r["rank"], window_s=r["window_s"])
        c["process_cpu_ms_per_step"] = 1e3 * c["process_cpu_s"] / n
        c["cpu_utilization"] = c["process_cpu_s"] / r["window_s"]
        if c["engine_cpu_s"] is not None:
            c["engine_cpu_ms_per_step"] = 1e3 * c["engine_cpu_s"] / n
            c["engine_cpu_fraction"] = (c["engine_cpu_s"] / c["process_cpu_s"]
                                        if c["process_cpu_s"] > 0 else float("nan"))
        cpu.append(c)
    record["cpu_per_rank"] = cpu
    # CPU the rest of the machine used during the window (other jobs on this
    # shared machine), in cores: all CPUs' busy time minus this run's ranks.
    busy = max(c["machine_busy_s"] for c in cpu)
    record["other_load_cores"] = max(0.0, busy - sum(c["process_cpu_s"] for c in cpu)) / window
    fracs = [c.get("engine_cpu_fraction") for c in cpu]
    if all(f is not None for f in fracs):
        record["engine_cpu_fraction"] = max(fracs)
        record["engine_cpu_fraction_per_rank"] = fracs


def _quantile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))]


def summarize(results):
    summary = {}
    for model, configs in results.items():
        def sps(c):
            rec = configs.get(c)
            return rec.get("samples_per_s") if rec else None
        keras_, np2, np1 = sps("keras_np1_t2"), sps("kd_np2_t1"), sps("kd_np1_t1")
        kd2 = configs.get("kd_np2_t1") or {}
        summary[model] = {
            "kd_np2_over_keras": np2 / keras_ if keras_ and np2 else None,
            "kd_np1_over_keras": (sps("kd_np1_t2") / keras_
                                  if keras_ and sps("kd_np1_t2") else None),
            "scaling_efficiency": np2 / (2 * np1) if np1 and np2 else None,
            "engine_cpu_fraction_np2": kd2.get("engine_cpu_fraction"),
            "other_load_cores_np2": kd2.get("other_load_cores"),
            "process_cpu_ms_per_step": {
                c: max(x["process_cpu_ms_per_step"] for x in configs[c]["cpu_per_rank"])
                for c in configs if "cpu_per_rank" in configs[c]},
            "engine_cpu_ms_per_step_np2": (
                max(c.get("engine_cpu_ms_per_step", 0) for c in kd2["cpu_per_rank"])
                if "cpu_per_rank" in kd2 else None),
        }
    return summary


def _fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"


def table(results, summary):
    cols = list(CONFIGS)
    lines = ["| model | batch/rank | " + " | ".join(CONFIGS[c][3] + " samples/s" for c in cols)
             + " | kd np=2 / Keras | scaling eff. | engine CPU np=2 (ms/step) "
             "| others' load np=2 |",
             "| --- " * (len(cols) + 6) + "|"]
    for model, configs in results.items():
        s = summary[model]
        cells = []
        for c in cols:
            rec = configs.get(c, {})
            cells.append((_fmt(rec.get("samples_per_s"), ".1f")
                          + ("*" if rec.get("contended") else "")) if "error" not in rec
                         else "failed")
        batch = next((r["batch_per_rank"] for r in configs.values()), "")
        eng = s["engine_cpu_fraction_np2"]
        eng_txt = (f"{100 * eng:.1f}% ({_fmt(s['engine_cpu_ms_per_step_np2'], '.2f')})"
                   if isinstance(eng, float) and math.isfinite(eng) else "n/a")
        lines.append(f"| {model} | {batch} | " + " | ".join(cells)
                     + f" | {_fmt(s['kd_np2_over_keras'], '.2f')}"
                     f" | {_fmt(s['scaling_efficiency'], '.2f')} | {eng_txt}"
                     f" | {_fmt(s['other_load_cores_np2'], '.2f')} cores |")
    return "\n".join(lines)


def machine_info():
    info = {"hostname": socket.gethostname(), "platform": platform.platform(),
            "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f
                               if line.startswith("model name"))
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, StopIteration):
        pass
    probe = subprocess.run(
        [sys.executable, "-c",
         "import tensorflow as tf, keras, mpi4py; print(tf.__version__, keras.__version__,"
         " mpi4py.__version__)"],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    parts = probe.stdout.split()
    if len(parts) == 3:
        info.update(tensorflow=parts[0], keras=parts[1], mpi4py=parts[2])
    git = subprocess.run(["git", "log", "-1", "--format=%h %s"], capture_output=True,
                         text=True, cwd=ROOT)
    info["kerasdist_commit"] = git.stdout.strip()
    return info


def plot(results, summary, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results)
    cols = list(CONFIGS)
    colors = ["#888888", "#9ecae1", "#4292c6", "#08519c"]
    fig, axes = plt.subplots(1, len(models) + 1, figsize=(4.2 * (len(models) + 1), 4.2))
    for ax, model in zip(axes, models):
        vals = [results[model].get(c, {}).get("samples_per_s") or 0 for c in cols]
        bars = ax.bar(range(len(cols)), vals, color=colors)
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.0f}" if v >= 10 else f"{v:.1f}",
                    ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels([CONFIGS[c][3].replace(" x", "\nx") for c in cols], fontsize=7)
        ax.set_title(f"{model} (batch {results[model].get(cols[0], {}).get('batch_per_rank', '?')}"
                     "/rank)", fontsize=9)
        ax.set_ylabel("samples/s (median step)")
    ax = axes[-1]
    width = 0.38
    ratio = [summary[m]["kd_np2_over_keras"] or 0 for m in models]
    eff = [summary[m]["scaling_efficiency"] or 0 for m in models]
    x = range(len(models))
    ax.bar([i - width / 2 for i in x], ratio, width, label="kd np=2 / Keras np=1 x2", color="#08519c")
    ax.bar([i + width / 2 for i in x], eff, width, label="scaling eff. (np=2 / 2x np=1 x1)",
           color="#fd8d3c")
    for i, (r, e) in enumerate(zip(ratio, eff)):
        ax.text(i - width / 2, r, f"{r:.2f}", ha="center", va="bottom", fontsize=8)
        ax.text(i + width / 2, e, f"{e:.2f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(list(x))
    ax.set_xticklabels(models, fontsize=8)
    ax.set_title("ratios (target: kd/Keras >= 1)", fontsize=9)
    ax.set_ylim(0, max([1.25] + [v * 1.15 for v in ratio + eff]))
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("kerasdist Keras synthetic benchmark (model.fit, 2-core CPU)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_run(model, config, rec):
    if "error" in rec:
        print(f"  {model:16s} {config:13s} FAILED: {rec['error']}", flush=True)
        return
    eng = rec.get("engine_cpu_fraction")
    print(f"  {model:16s} {config:13s} {rec['samples_per_s']:9.1f} samples/s"
          f"  median step {1e3 * rec['median_step_s']:8.2f} ms"
          f"  (p10 {1e3 * rec['p10_step_s']:.2f}, p90 {1e3 * rec['p90_step_s']:.2f})"
          + (f"  engine CPU {100 * eng:.1f}%" if eng is not None else "")
          + f"  others {rec['other_load_cores']:.2f} cores"
          + f"  [{rec['wall_s']:.0f} s, load {rec['loadavg_start'][0]:.1f}]", flush=True)


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
    p.add_argument("--json", default=os.path.join(RESULTS, "keras_synthetic.json"))
    p.add_argument("--png", default=os.path.join(RESULTS, "keras_synthetic.png"))
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
    # Worker mode (one rank), used by the orchestrator.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--kerasdist", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
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
    text = table(results, summary)
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
            "busy_cores": a.busy_cores, "busy_retries": a.busy_retries, "timing": (
                "fit over Dataset.from_tensors(batch).repeat(); step = interval between "
                "on_train_batch_end calls after the warm-up, max over ranks, median"),
            "argv": sys.argv[1:]},
        "results": results, "summary": summary, "table": text, "failed": failed,
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)
    if a.png:
        os.makedirs(os.path.dirname(os.path.abspath(a.png)), exist_ok=True)
        plot(results, summary, a.png)
    print(f"\nwrote {a.json}" + (f" and {a.png}" if a.png else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
