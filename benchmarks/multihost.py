"""Multi-host allreduce benchmark on namespaced test hosts (tests/hosts.py).

Run as root from the repository root: `python benchmarks/multihost.py
[--layouts 2x2 4x1] [--rates none 10gbit 1gbit] [--quick]`. For each layout
(hosts x ranks per host) it builds the hosts once and, for each link shaping
(`tc tbf` on every host link, both directions; `none` = unshaped veths),
runs one job of `benchmarks/_multihost_rank.py` that measures, per float32
size, kerasdist's flat ring (KERASDIST_HIERARCHICAL_ALLREDUCE=0), kerasdist's
hierarchical allreduce (=1) and MPICH's `MPI_Allreduce` through mpi4py, on
the same hosts in the same job. It reports bus bandwidth 2(N-1)/N * S / t,
the ratios kd/MPICH, and the bytes each host sends to other hosts per
allreduce (its eth0 counters around the timed loop / iterations). Prints
markdown tables, writes benchmarks/results/multihost/multihost.json and
benchmarks/results/multihost/multihost.png. Only namespaces made by tests/hosts.py
carry traffic; nothing is routed out of them.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import hosts  # noqa: E402

KIB, MIB = 1024, 1 << 20
LAYOUTS = {"2x2": [2, 2], "4x1": [1, 1, 1, 1]}
SIZES = ["4K", "16K", "64K", "256K", "1M", "4M", "16M", "64M"]
SLOW_SIZES = ["4K", "64K", "1M", "16M", "64M"]  # under 1 Gbit/s and slower
METHODS = ("flat", "hier", "mpich")
LABELS = {"flat": "kd flat ring", "hier": "kd hierarchical", "mpich": "MPICH"}


def fmt_size(nbytes):
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def fmt_time(s):
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def slow(rate):
    return rate != "none" and hosts._parse_rate_bits(rate) <= 2e9


def run_case(cluster, slots, rate, args):
    """One job on the cluster at one shaping; returns its rows."""
    if rate == "none":
        cluster.unshape()
    else:
        cluster.shape(rate)
    sizes = SLOW_SIZES if slow(rate) else SIZES
    target = (0.5 if slow(rate) else 0.8) * (0.3 if args.quick else 1.0)
    argv = [sys.executable, os.path.join(HERE, "_multihost_rank.py"), "--sizes", *sizes,
            "--target-s", str(target), "--min-iters", "2" if slow(rate) else "3"]
    env = {"KERASDIST_TIMEOUT_SECONDS": "120", "KERASDIST_INIT_TIMEOUT_SECONDS": "120"}
    result = cluster.mpirun(argv, slots, timeout=args.job_timeout, env=env,
                            cwd=os.path.dirname(HERE))
    cluster.kill_jobs()
    rows = [json.loads(line[6:]) for line in result.output.splitlines()
            if line.startswith("MHROW ")]
    if not result.ok:
        raise RuntimeError(f"job on {slots} at {rate} failed: {result.describe()}")
    for row in rows:
        row.update(rate=rate, slots=slots)
    print(f"  {rate}: {len(rows)} rows in {result.seconds:.0f} s", flush=True)
    return rows


def table(rows, layout, rate):
    """Markdown: busbw, ratios and inter-host bytes per size."""
    by = {(r["method"], r["bytes"]): r for r in rows}
    sizes = sorted({r["bytes"] for r in rows})
    out = [f"\n### {layout}, links {'unshaped' if rate == 'none' else 'tbf ' + rate}\n",
           "| size | flat busbw GB/s | hier busbw GB/s | MPICH busbw GB/s | flat/MPICH "
           "| hier/MPICH | MPICH time | tx/host flat MiB | tx/host hier MiB "
           "| tx/host MPICH MiB |",
           "|---:" * 10 + "|"]
    for s in sizes:
        r = {m: by.get((m, s)) for m in METHODS}
        if not all(r.values()):
            continue
        bw = {m: r[m]["busbw_GBps"] for m in METHODS}
        tx = {m: max(r[m]["host_tx_bytes"]) / MIB for m in METHODS}
        out.append(f"| {fmt_size(s)} | {bw['flat']:.3f} | {bw['hier']:.3f} | "
                   f"{bw['mpich']:.3f} | {bw['flat'] / bw['mpich']:.2f} | "
                   f"{bw['hier'] / bw['mpich']:.2f} | {fmt_time(r['mpich']['seconds'])} | "
                   f"{tx['flat']:.3f} | {tx['hier']:.3f} | {tx['mpich']:.3f} |")
    return "\n".join(out)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layouts = sorted({r["layout"] for r in results["rows"]})
    rates = list(dict.fromkeys(r["rate"] for r in results["rows"]))
    fig, axes = plt.subplots(len(layouts), len(rates), squeeze=False,
                             figsize=(4.2 * len(rates), 3.4 * len(layouts)))
    for i, layout in enumerate(layouts):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            for m in METHODS:
                pts = sorted((r["bytes"], r["busbw_GBps"]) for r in results["rows"]
                             if r["layout"] == layout and r["rate"] == rate
                             and r["method"] == m)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                            label=LABELS[m])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{layout}, {'unshaped' if rate == 'none' else rate}")
            ax.set_xlabel("allreduce size (bytes)")
            ax.set_ylabel("bus bandwidth (GB/s)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"Allreduce across namespaced hosts, {results['date'][:16]} UTC")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    p.add_argument("--rates", nargs="+", default=["none", "10gbit", "1gbit"])
    p.add_argument("--quick", action="store_true", help="Shorter timed loops.")
    p.add_argument("--job-timeout", type=float, default=400)
    p.add_argument("--out", default=os.path.join(HERE, "results", "local", "multihost"),
                   help="Path prefix of the .json and .png results.")
    args = p.parse_args()
    reason = hosts.unavailable_reason()
    if reason:
        sys.exit(f"benchmarks/multihost.py: cannot make test hosts: {reason}")
    start = time.monotonic()
    git = subprocess.run(["git", "log", "-1", "--format=%h %s"], capture_output=True,
                         text=True, cwd=HERE).stdout.strip()
    results = {"date": datetime.datetime.now(datetime.timezone.utc)
               .isoformat(timespec="seconds"), "commit": git[:120],
               "nproc": os.cpu_count(), "rows": []}
    for layout in args.layouts:
        slots = LAYOUTS[layout]
        print(f"{layout}: {len(slots)} hosts x {slots[0]} ranks", flush=True)
        with hosts.Cluster(len(slots)) as cluster:
            for rate in args.rates:
                for row in run_case(cluster, slots, rate, args):
                    results["rows"].append({"layout": layout, **row})
    results["elapsed_s"] = time.monotonic() - start
    print(f"\n## Multi-host allreduce, float32 Sum ({results['date']}, {git[:60]})")
    print("busbw = 2(N-1)/N * S / t (slowest rank); tx/host = bytes the busiest host "
          "sent to other hosts per allreduce (eth0 counters, IP headers included)")
    for layout in args.layouts:
        for rate in args.rates:
            rows = [r for r in results["rows"] if r["layout"] == layout and r["rate"] == rate]
            print(table(rows, layout, rate))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    plot(results, args.out + ".png")
    print(f"\nTotal {results['elapsed_s']:.0f} s. Wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
