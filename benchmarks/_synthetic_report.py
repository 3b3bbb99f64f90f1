"""Figures, table, plot and machine facts of `keras_synthetic.py`.

Kept apart from the runner so each file stays readable. `combine` turns the
ranks' JSON of one run into its record; `table` and `plot` take the runner's
`configs` table (name -> (kerasdist?, ranks, threads, label)).
"""

import math
import os
import platform
import socket
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def combine(record, ranks):
    """Per-step max over ranks, median, samples/s and CPU figures.

    Independent processes do not step together: each one's throughput is
    its batch over its own median step, and the record's is their sum.
    """
    n = len(ranks[0]["step_s"])
    window = max(r["window_s"] for r in ranks)
    gb = record["global_batch"]
    if record.get("independent"):
        per_step = sorted(t for r in ranks for t in r["step_s"])
        median = statistics.median(per_step)
        sps = sum(r["batch"] / statistics.median(r["step_s"]) for r in ranks)
        sps_mean = sum(r["batch"] * len(r["step_s"]) / r["window_s"] for r in ranks)
        # How much of the longest window all of them were measuring at once.
        starts, ends = zip(*(r["window_wall"] for r in ranks))
        record["window_overlap"] = max(0.0, min(ends) - max(starts)) / max(
            e - b for b, e in zip(starts, ends))
    else:
        per_step = [max(r["step_s"][i] for r in ranks) for i in range(n)]
        median = statistics.median(per_step)
        sps, sps_mean = gb / median, gb * n / window
    record.update(
        median_step_s=median,
        p10_step_s=_quantile(per_step, 0.1), p90_step_s=_quantile(per_step, 0.9),
        samples_per_s=sps, samples_per_s_mean=sps_mean,
        first_batch_s=max(r["first_batch_s"] for r in ranks),
        params=ranks[0]["params"], loss=[r["loss"] for r in ranks],
        grad_types=ranks[0]["grad_types"], transport=ranks[0].get("transport"),
    )
    cpu = []
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
    """Per model: the ratios the README reports, from the kept runs."""
    summary = {}
    for model, configs in results.items():
        def sps(c):
            rec = configs.get(c)
            return rec.get("samples_per_s") if rec else None

        def ratio(num, den):
            return num / den if num and den else None

        keras_, np2, np1 = sps("keras_np1_t2"), sps("kd_np2_t1"), sps("kd_np1_t1")
        pair = sps("keras_2x_t1")
        kd2 = configs.get("kd_np2_t1") or {}
        summary[model] = {
            "kd_np2_over_keras": ratio(np2, keras_),
            "kd_np1_over_keras": ratio(sps("kd_np1_t2"), keras_),
            "scaling_efficiency": ratio(np2, 2 * np1 if np1 else None),
            # Two plain-Keras processes side by side, no communication: what
            # data parallelism could reach on these cores, against one
            # two-threaded process, and how much of it kerasdist reaches.
            "two_processes_over_keras": ratio(pair, keras_),
            "kd_np2_over_two_processes": ratio(np2, pair),
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


def table(results, summary, configs):
    """The markdown table: samples/s per configuration, then the ratios."""
    cols = list(configs)
    lines = ["| model | batch/rank | " + " | ".join(configs[c][3] + " samples/s" for c in cols)
             + " | kd np=2 / Keras | 2 procs / Keras | kd np=2 / 2 procs | scaling eff. "
             "| engine CPU np=2 (ms/step) | others' load np=2 |",
             "| --- " * (len(cols) + 8) + "|"]
    for model, recs in results.items():
        s = summary[model]
        cells = []
        for c in cols:
            rec = recs.get(c, {})
            cells.append((_fmt(rec.get("samples_per_s"), ".1f")
                          + ("*" if rec.get("contended") else "")) if "error" not in rec
                         else "failed")
        batch = next((r["batch_per_rank"] for r in recs.values()), "")
        eng = s["engine_cpu_fraction_np2"]
        eng_txt = (f"{100 * eng:.1f}% ({_fmt(s['engine_cpu_ms_per_step_np2'], '.2f')})"
                   if isinstance(eng, float) and math.isfinite(eng) else "n/a")
        lines.append(f"| {model} | {batch} | " + " | ".join(cells)
                     + f" | {_fmt(s['kd_np2_over_keras'], '.2f')}"
                     f" | {_fmt(s['two_processes_over_keras'], '.2f')}"
                     f" | {_fmt(s['kd_np2_over_two_processes'], '.2f')}"
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


def plot(results, summary, path, configs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results)
    cols = list(configs)
    palette = {"keras_np1_t2": "#888888", "kd_np1_t2": "#9ecae1", "kd_np1_t1": "#4292c6",
               "kd_np2_t1": "#08519c", "keras_2x_t1": "#bbbbbb"}
    colors = [palette.get(c, "#666666") for c in cols]
    fig, axes = plt.subplots(1, len(models) + 1, figsize=(4.4 * (len(models) + 1), 4.4))
    for ax, model in zip(axes, models):
        vals = [results[model].get(c, {}).get("samples_per_s") or 0 for c in cols]
        bars = ax.bar(range(len(cols)), vals, color=colors)
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.0f}" if v >= 10 else f"{v:.1f}",
                    ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels([configs[c][3].replace(" x", "\nx") for c in cols], fontsize=7)
        ax.set_title(f"{model} (batch {results[model].get(cols[0], {}).get('batch_per_rank', '?')}"
                     "/rank)", fontsize=9)
        ax.set_ylabel("samples/s (median step)")
    ax = axes[-1]
    series = [("kd_np2_over_keras", "kd np=2 / Keras np=1 x2", "#08519c"),
              ("kd_np2_over_two_processes", "kd np=2 / 2 Keras procs (no comm.)", "#74a9cf"),
              ("scaling_efficiency", "scaling eff. (np=2 / 2x np=1 x1)", "#fd8d3c")]
    width = 0.8 / len(series)
    top = 1.25
    for j, (key, label, color) in enumerate(series):
        vals = [summary[m][key] or 0 for m in models]
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(models))]
        ax.bar(xs, vals, width, label=label, color=color)
        for x, v in zip(xs, vals):
            ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=6, rotation=90)
        top = max([top] + [v * 1.15 for v in vals])
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(list(range(len(models))))
    ax.set_xticklabels(models, fontsize=8)
    ax.set_title("ratios (target: kd/Keras >= 1)", fontsize=9)
    ax.set_ylim(0, top * 1.35)  # room for the legend above the bars
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
          + (f"  windows overlap {rec['window_overlap']:.2f}" if "window_overlap" in rec else "")
          + f"  others {rec['other_load_cores']:.2f} cores"
          + f"  [{rec['wall_s']:.0f} s, load {rec['loadavg_start'][0]:.1f}]", flush=True)
