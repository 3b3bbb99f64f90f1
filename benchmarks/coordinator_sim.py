"""Rank 0's coordinator cost at 8 to 1024 ranks, by simulation.

Compiles benchmarks/coordinator_sim.cc together with the core's coordinator,
message codec, common and clock files (no TensorFlow, no MPI), runs it, prints
a table, and writes benchmarks/results/coordinator_sim/coordinator_sim.json and a log-log plot
benchmarks/results/coordinator_sim/coordinator_sim.png. See README.md, "Cost at scale".

    python benchmarks/coordinator_sim.py [--ranks 8,16,...,1024] [--steps 50]
        [--tensors 200] [--fusion-bytes B] [--save-before] [--no-plot]

The binary is cached under /tmp by the hash of its sources, headers, flags
and compiler. Run timings you report under
`flock /tmp/kerasdist-bench.lock python benchmarks/coordinator_sim.py`.
Exit status: the simulator's (1 if a correctness check failed).
"""

import argparse
import datetime
import glob
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORE = os.path.join(ROOT, "kerasdist", "csrc", "core")
SOURCE = os.path.join(HERE, "coordinator_sim.cc")
RESULTS = os.path.join(HERE, "results")
CORE_SOURCES = ("coordinator/coordinator*.cc", "wire/message.cc", "common/common.cc",
                "common/clock.cc")
# The core's flags from setup.py, minus TensorFlow's and MPI's (the core
# needs neither), at -O2.
CXXFLAGS = ["-std=c++17", "-O2", "-DNDEBUG", "-D_GLIBCXX_USE_CXX11_ABI=1",
            "-Wno-deprecated-declarations", "-Wno-sign-compare", "-pthread"]
CACHE = os.path.join(tempfile.gettempdir(), "kerasdist-coordinator-sim")
DEFAULT_RANKS = [8, 16, 32, 64, 128, 256, 512, 1024]


def compiler():
    return os.environ.get("CXX", "g++")


def build(core=CORE):
    """Compiles the simulator (cached by input hash); returns its path."""
    cxx = compiler()
    if not shutil.which(cxx):
        raise FileNotFoundError(f"C++ compiler {cxx!r} not found")
    sources = [SOURCE] + sorted(p for f in CORE_SOURCES for p in glob.glob(os.path.join(core, f)))
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    h = hashlib.sha256((" ".join(CXXFLAGS) + "\0" + version).encode())
    for path in sources + sorted(glob.glob(os.path.join(core, "*", "*.h"))):
        with open(path, "rb") as f:
            h.update(b"\0" + os.path.basename(path).encode() + b"\0" + f.read())
    out_dir = os.path.join(CACHE, h.hexdigest()[:20])
    exe = os.path.join(out_dir, "coordinator_sim")
    if os.path.exists(exe):
        return exe
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{exe}.{os.getpid()}.tmp"
    cmd = [cxx, *CXXFLAGS, "-I", core, *sources, "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling failed:\n{' '.join(cmd)}\n{proc.stderr[-6000:]}")
    os.replace(tmp, exe)
    return exe


def run(exe, ranks, steps=50, tensors=200, check_steps=5, fusion_bytes=0, seed=1,
        timeout=1200, drop_one=False, tensor_limit=0):
    """Runs the simulator. Returns (returncode, per-N results, stderr).

    drop_one: the fault that the checks must catch (one tensor left out).
    """
    cmd = [exe, "--ranks", ",".join(map(str, ranks)), "--steps", str(steps),
           "--tensors", str(tensors), "--check-steps", str(check_steps),
           "--seed", str(seed)]
    if fusion_bytes:
        cmd += ["--fusion-bytes", str(fusion_bytes)]
    if drop_one:
        cmd += ["--drop-one", "1"]
    if tensor_limit:
        cmd += ["--tensor-limit", str(tensor_limit)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, rows, proc.stderr


def fit(rows):
    """t(N) = a + c*N*T over the in-order medians, least squares in relative
    error (weights 1/t^2, so that small N count as much as large N); and the
    log-log slope over N >= 64 (1 = linear)."""
    import math

    xs = [r["ranks"] for r in rows]
    ys = [r["scenarios"]["inorder"]["median_us"] for r in rows]
    if len(xs) < 2:
        return None
    w = [1 / y ** 2 for y in ys]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs))
    sy = sum(wi * y for wi, y in zip(w, ys))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys))
    b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    a = (sy - b * sx) / sw
    tensors = rows[0]["tensors"]
    worst = max(abs(a + b * x - y) / y for x, y in zip(xs, ys))
    big = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x >= 64]
    slope = None
    if len(big) >= 2:
        mx = sum(p[0] for p in big) / len(big)
        my = sum(p[1] for p in big) / len(big)
        slope = (sum((p[0] - mx) * (p[1] - my) for p in big) /
                 sum((p[0] - mx) ** 2 for p in big))
    return {"a_us": a, "b_us_per_rank": b, "c_ns_per_rank_tensor": 1000 * b / tensors,
            "max_relative_error": worst, "loglog_slope_n_ge_64": slope}


def table(rows, before=None):
    old = {r["ranks"]: r["scenarios"]["inorder"]["median_us"] for r in before or []}
    head = (["ranks"] + (["before median us"] if old else []) +
            ["median us", "p90 us", "cpu median us", "parse only", "parse+submit", "plan",
             "serialize", "recv B/step", "sent B/step", "ns/(rank*tensor)", "checks"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        s = r["scenarios"]["inorder"]
        per = 1000 * s["median_us"] / (r["ranks"] * r["tensors"])
        cells = ([r["ranks"]] + ([f"{old[r['ranks']]:.0f}" if r["ranks"] in old else "-"]
                                 if old else []) +
                 [f"{s['median_us']:.0f}", f"{s['p90_us']:.0f}", f"{s['cpu_median_us']:.0f}",
                  f"{s['parse_only_median_us']:.0f}", f"{s['submit_median_us']:.0f}",
                  f"{s['plan_median_us']:.0f}", f"{s['serialize_median_us']:.0f}",
                  f"{s['bytes_received']:,}", f"{s['bytes_sent']:,}", f"{per:.1f}",
                  "ok" if r["ok"] else "FAIL"])
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def plot(rows, path, before=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    xs = [r["ranks"] for r in rows]

    def series(rs, label, style):
        x = [r["ranks"] for r in rs]
        med = [r["scenarios"]["inorder"]["median_us"] / 1000 for r in rs]
        p90 = [r["scenarios"]["inorder"]["p90_us"] / 1000 for r in rs]
        ax.plot(x, med, style, label=f"{label} median")
        ax.plot(x, p90, style.replace("-", ":"), alpha=0.6, label=f"{label} p90")

    if before:
        series(before, "before", "s-")
    series(rows, "now" if before else "coordinator", "o-")
    last = rows[-1]["scenarios"]["inorder"]["median_us"] / 1000
    ax.plot(xs, [last * x / xs[-1] for x in xs], "k--", lw=0.8, label="linear in N")
    ax.axhline(1.0, color="r", lw=0.8, ls="-.", label="1 ms target")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks N")
    ax.set_ylabel("rank 0 control-plane time per step (ms)")
    ax.set_title(f"Coordinator per step, {rows[0]['tensors']} cached tensors")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default=",".join(map(str, DEFAULT_RANKS)))
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--tensors", type=int, default=200)
    p.add_argument("--check-steps", type=int, default=5)
    p.add_argument("--fusion-bytes", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    # Default outputs go to results/local/ (not committed), so that a run
    # never overwrites a recorded one.
    p.add_argument("--json", default=os.path.join(RESULTS, "local", "coordinator_sim.json"))
    p.add_argument("--png", default=os.path.join(RESULTS, "local", "coordinator_sim.png"))
    p.add_argument("--before", default=os.path.join(RESULTS, "coordinator_sim",
                                                 "coordinator_sim_before.json"),
                   help="earlier results to overlay in the plot (if the file exists)")
    p.add_argument("--save-before", action="store_true",
                   help="write the results to --before instead of --json (no plot)")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    ranks = [int(x) for x in args.ranks.split(",")]
    exe = build()
    rc, rows, err = run(exe, ranks, args.steps, args.tensors, args.check_steps,
                        args.fusion_bytes, args.seed)
    if err:
        sys.stderr.write(err)
    if not rows:
        sys.stderr.write(f"coordinator_sim produced no results (exit {rc})\n")
        return rc or 1
    before = None
    if not args.save_before and args.before and os.path.exists(args.before):
        with open(args.before) as f:
            before = json.load(f)["results"]
    print(table(rows, before))
    model = fit(rows)
    if model:
        slope = model["loglog_slope_n_ge_64"]
        print(f"fit: t(N) = {model['a_us']:.1f} us + {model['b_us_per_rank']:.3f} us * N "
              f"({model['c_ns_per_rank_tensor']:.2f} ns per rank per tensor), "
              f"worst relative error {model['max_relative_error']:.0%}"
              + (f"; log-log slope for N >= 64: {slope:.2f}" if slope is not None else ""))
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"host": socket.gethostname(), "cpu": platform.processor(),
                    "cores": os.cpu_count()},
        "commit": git,
        "compiler": [compiler(), *CXXFLAGS],
        "args": vars(args),
        "exit_status": rc,
        "fit_inorder_us": model,
        "results": rows,
    }
    path = args.before if args.save_before else args.json
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")
    if not (args.no_plot or args.save_before):
        plot(rows, args.png, before)
        print(f"wrote {args.png}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
