"""Allreduce benchmark: kerasdist's engine against MPICH and memcpy.

Run on N ranks: `mpiexec -n 2 python benchmarks/allreduce.py [--sizes 4K 1M]
[--iters N] [--blocks B] [--json PATH] [--quick]` (or under `kerasdist-run`).
Per float32 buffer size it measures `kd eager` (`kerasdist.allreduce(x,
op=Sum)`, fixed name, same input), `kd tf.function` (a chain of the op in a
while loop inside one `tf.function` call, see `make_loop_fn`), `MPICH`
(`comm.Allreduce` on numpy arrays) and `memcpy` (`np.copyto`, all ranks
copying at once).

Methods are interleaved block by block, in a rotating order, so that noise
on a shared machine hits all of them alike. Each block starts with
`comm.Barrier()` and times `iters` samples with `time.perf_counter()`; a
sample averages `inner` back-to-back ops so that fast ops are not lost in
timer overhead. A rank's time is the smallest of its block medians; the
reported time is the largest over ranks. Bus bandwidth is
`bytes * 2(N-1)/N / time`, memcpy bandwidth `bytes / time`. It also times a
step of 100 tensors of 4 KiB against one of 400 KiB, TensorFlow's own floors
at 4 KiB (an eager op, a while-loop iteration; see `bench_floors`), and
checks every
kerasdist path once per size against the exact sum (exit status 1 if wrong;
`--quick` is the CI smoke test).
"""

import argparse
import datetime
import json
import math
import os
import platform
import socket
import sys
import time

import numpy as np

KIB = 1024
MIB = KIB * KIB
DEFAULT_SIZES = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
GROUP_COUNT, GROUP_BYTES = 100, 4 * KIB
CHAIN = 8  # allreduces per while-loop iteration in `kd tf.function`


def parse_size(text):
    """Parses `4K`, `64KiB`, `1M`, `16MiB` or a plain byte count."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": KIB, "M": MIB, "G": KIB * MIB}.get(t[-1:], 1)
    digits = t[:-1] if mult > 1 else t
    value = int(float(digits) * mult) if digits.replace(".", "", 1).isdigit() else 0
    if value <= 0 or value % 4:
        raise argparse.ArgumentTypeError(
            f"Expected a positive multiple of 4 bytes such as 4K or 1MiB. Received: {text!r}")
    return value


def fmt_size(nbytes):
    unit, scale = next(u for u in (("MiB", MIB), ("KiB", KIB), ("B", 1)) if nbytes % u[1] == 0)
    return f"{nbytes // scale} {unit}"


def fmt_time(seconds):
    return f"{seconds * 1e6:7.1f}us" if seconds < 1e-3 else f"{seconds * 1e3:7.2f}ms"


def run_block(op, inner, samples):
    """Returns `samples` per-op times, each the mean over `op(inner)`."""
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        op(inner)
        times.append((time.perf_counter() - t0) / inner)
    return times


class Bench:
    """Calibrates named methods, then times them interleaved across blocks.

    Args:
        comm: The mpi4py communicator of the ranks.
        args: The parsed command line (`quick`, `iters`, `blocks`).
    """

    def __init__(self, comm, args):
        from mpi4py import MPI

        self.comm, self.MAX, self.iters = comm, MPI.MAX, args.iters
        self.blocks = args.blocks or (3 if args.quick else 5)
        self.block_time = 0.04 if args.quick else 0.3  # s per method and block
        self.min_samples, self.warmup = (2, 2) if args.quick else (3, 4)
        self.plan, self.counts = {}, {}

    def add(self, name, op, min_inner=1, sample_time=1e-3):
        """Warms up `op(k)`, which runs k ops, and sizes its samples.

        `inner` (ops per sample) and `samples` (per block) come from the
        slowest rank's estimate, so every rank runs as many collectives.
        """
        op(min_inner)  # first call: tracing, allocation, name negotiation
        est = np.median(run_block(op, min_inner, self.warmup))
        est = max(self.comm.allreduce(float(est), op=self.MAX), 1e-8)
        inner = int(min(1000, max(min_inner, math.ceil(sample_time / est))))
        inner = -(-inner // min_inner) * min_inner  # whole calls of a chained op
        samples = self.iters or int(
            min(5000, max(self.min_samples, round(self.block_time / (est * inner)))))
        self.plan[name] = (op, inner, samples)

    def run(self):
        """Times the added methods; returns `{name: seconds per op}`."""
        names = list(self.plan)
        best = dict.fromkeys(names, math.inf)
        for b in range(self.blocks):
            for name in names[b % len(names):] + names[:b % len(names)]:
                op, inner, samples = self.plan[name]
                self.comm.Barrier()
                best[name] = min(best[name], float(np.median(run_block(op, inner, samples))))
        self.counts = {n: {"inner": p[1], "samples": p[2], "blocks": self.blocks}
                       for n, p in self.plan.items()}
        self.plan = {}
        return {n: self.comm.allreduce(best[n], op=self.MAX) for n in names}


def make_loop_fn(kd, tf, name, chain=CHAIN):
    """Returns `run(x, k)`: k allreduces of `x`, `chain` per iteration of a
    while loop in one `tf.function` call (k must be a multiple of `chain`).

    One op per call would mostly time `tf.function` dispatch (~0.5 ms of
    Python and executor setup per call on a small VM, none of it
    kerasdist's). Running many ops per call amortizes that, and chaining
    `chain` ops in the loop's body amortizes the loop's own cost per
    iteration (5-7 us here, more than a 4 KiB allreduce: see
    `bench_floors`), so the per-op time is what an allreduce costs among the
    ops of a training step: kernel launch on the inter-op pool, negotiation,
    copies and the reduction. Each op reduces the previous result, so the
    ops run one at a time and one name never has two ops in flight; with
    zeros as input the sum stays finite.
    """

    def body(i, y):
        for _ in range(chain):
            y = kd.allreduce(y, op=kd.Sum, name=name)
        return i + 1, y

    @tf.function
    def loop(x, iterations):
        return tf.while_loop(lambda i, y: i < iterations, body, (tf.constant(0), x))[1]

    def run(x, k):
        if k % chain:
            raise ValueError(f"Expected a multiple of {chain} allreduces. Received: k={k}")
        return loop(x, tf.constant(k // chain))

    return run


def rank_data(n, comm):
    """Returns this rank's input and the exact Sum over ranks (float32)."""
    pattern = (np.arange(n) % 13).astype(np.float32)
    size = comm.Get_size()  # small integers: float32 sums are exact
    return pattern + comm.Get_rank(), pattern * size + size * (size - 1) / 2


def verify(comm, label, results):
    """Raises AssertionError on every rank if any `(got, want)` differ."""
    bad = [k for k, (got, want) in results.items() if not np.array_equal(got, want)]
    msgs = [f"rank {r}: {', '.join(b)}" for r, b in enumerate(comm.allgather(bad)) if b]
    if msgs:
        raise AssertionError(f"{label}: wrong sum from " + "; ".join(msgs))


def repeat(step):
    """Returns `op(k)`, which calls `step()` k times."""
    def op(k):
        for _ in range(k):
            step()
    return op


def bench_size(nbytes, bench, comm, kd, tf):
    """Checks, then times the four methods at one size; returns a row."""
    from mpi4py import MPI

    n, size = nbytes // 4, comm.Get_size()
    loop_fn = make_loop_fn(kd, tf, f"bench.fn.{nbytes}")
    local, exact = rank_data(n, comm)
    mpich = np.empty_like(local)
    comm.Allreduce(local, mpich, op=MPI.SUM)
    # One iteration of the chain multiplies the sum by size**(CHAIN - 1):
    # exact in float32 while it stays below 2**24 (up to 5 ranks).
    scale = float(size) ** (CHAIN - 1)
    chained = ({"kd tf.function chain": (loop_fn(tf.constant(local), CHAIN),
                                         (exact * scale).astype(np.float32))}
               if scale * float(np.max(exact)) < 2 ** 24 else {})
    verify(comm, fmt_size(nbytes), {
        "MPICH": (mpich, exact),
        "kd eager": (kd.allreduce(tf.constant(local), op=kd.Sum, name=f"check.{nbytes}"), exact),
        "kd tf.function x2": (make_loop_fn(kd, tf, f"check.fn.{nbytes}", 1)(
            tf.constant(local), 2), exact * size), **chained})
    x, zeros = tf.ones([n]), tf.zeros([n])
    send, recv, dst = (np.full(n, v, np.float32) for v in (1, 0, 0))
    name = f"bench.eager.{nbytes}"
    bench.add("kd_eager", repeat(lambda: kd.allreduce(x, op=kd.Sum, name=name)))
    # A tf.function call costs ~0.5 ms here: >= 1 chain and ~20 ms per sample.
    bench.add("kd_fn", lambda k: loop_fn(zeros, k), CHAIN, 20e-3)
    bench.add("mpich", repeat(lambda: comm.Allreduce(send, recv, op=MPI.SUM)))
    bench.add("memcpy", repeat(lambda: np.copyto(dst, send)))
    t = bench.run()
    bus = nbytes * 2 * (size - 1) / size
    row = {"bytes": nbytes, "counts": bench.counts}
    for key in ("kd_eager", "kd_fn", "mpich"):
        row[key + "_s"], row[key + "_busbw_GBps"] = t[key], bus / t[key] / 1e9
    row["memcpy_s"], row["memcpy_GBps"] = t["memcpy"], nbytes / t["memcpy"] / 1e9
    # The printed ratios are the `tf.function`'s (the targets are set there);
    # the JSON also keeps the faster of eager and `tf.function`, as before.
    best = min(t["kd_eager"], t["kd_fn"])
    for name, kd_s in (("kd_fn", t["kd_fn"]), ("kd_best", best)):
        row[f"bw_ratio_{name}_over_mpich"] = t["mpich"] / kd_s
        row[f"bw_ratio_{name}_over_memcpy"] = bus / kd_s / 1e9 / row["memcpy_GBps"]
    return row


def bench_grouped(bench, comm, kd, tf):
    """Times one step of 100 tensors of 4 KiB and one of a 400 KiB tensor."""
    from mpi4py import MPI

    n, count = GROUP_BYTES // 4, GROUP_COUNT
    big, small = tf.ones([count * n]), [tf.ones([n]) for _ in range(count)]
    # In the functions the 100 tensors are made inside the step, as gradients
    # are, and consumed there (concatenated), as an optimizer consumes them:
    # 100 arguments or 100 results would add Python and eager-tensor handling
    # to every call (about 0.6 ms here), none of it kerasdist's. The same
    # function without the allreduce is timed as the framework's share.
    fn_grouped = tf.function(lambda t: tf.concat(kd.grouped_allreduce(
        tf.split(t, count), op=kd.Sum, name="bench.g100fn"), 0))
    fn_frame = tf.function(lambda t: tf.concat(tf.split(t, count), 0))
    fn_single = tf.function(lambda t: kd.allreduce(t, op=kd.Sum, name="bench.g1fn"))
    fn_call = tf.function(tf.identity)  # the call alone, the single's framework share
    bsend, brecv = np.ones(count * n, np.float32), np.zeros(count * n, np.float32)
    pairs = list(zip(np.split(bsend, count), np.split(brecv, count)))  # contiguous views
    local, exact = rank_data(count * n, comm)
    verify(comm, "grouped", {
        "kd tf.function grouped": (fn_grouped(tf.constant(local)), exact),
        "kd eager grouped": (tf.concat(kd.grouped_allreduce(
            tf.split(local, count), op=kd.Sum, name="check.g100e"), 0), exact)})
    many = f"{count}x{fmt_size(GROUP_BYTES)}"
    one = f"1x{fmt_size(count * GROUP_BYTES)}"
    bench.add(f"kd tf.function {many}", repeat(lambda: fn_grouped(big)))
    bench.add(f"kd tf.function {one}", repeat(lambda: fn_single(big)))
    bench.add(f"tf.function split+concat only", repeat(lambda: fn_frame(big)))
    bench.add(f"tf.function identity only", repeat(lambda: fn_call(big)))
    bench.add(f"kd eager grouped {many}", repeat(
        lambda: kd.grouped_allreduce(small, op=kd.Sum, name="bench.g100e")))
    bench.add(f"kd eager {one}", repeat(lambda: kd.allreduce(big, op=kd.Sum, name="bench.g1e")))
    bench.add(f"MPICH {many}", repeat(lambda: [comm.Allreduce(a, b) for a, b in pairs]))
    bench.add(f"MPICH {one}", repeat(lambda: comm.Allreduce(bsend, brecv, op=MPI.SUM)))
    return bench.run()


def bench_floors(bench, kd, tf):
    """Times TensorFlow's own costs around a 4 KiB op, against kerasdist's.

    An eager `tf.identity` is the least an eager op costs; a while-loop
    iteration that multiplies is what `kd tf.function` would add per op if
    each op had its own iteration (`kd tf.function 1 per iteration`).
    """
    n = 4 * KIB // 4
    x, zeros = tf.ones([n]), tf.zeros([n])
    one_per_iter = make_loop_fn(kd, tf, "bench.floor.kd", 1)

    @tf.function
    def mul_loop(y, k):  # one multiply per iteration: the loop's own cost
        return tf.while_loop(lambda i, v: i < k, lambda i, v: (i + 1, v * 1.0),
                             (tf.constant(0), y))[1]

    bench.add("tf eager identity", repeat(lambda: tf.identity(x)))
    bench.add("tf.function loop iteration (multiply)",
              lambda k: mul_loop(zeros, tf.constant(k)), 4, 20e-3)
    bench.add("kd tf.function 1 per iteration",
              lambda k: one_per_iter(zeros, k), 4, 20e-3)
    return bench.run()


def machine_info(comm, kd, tf):
    """Host, versions, date and the settings that affect the numbers."""
    from mpi4py import MPI
    import mpi4py

    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    prefixes = ("KERASDIST_", "MPIR_CVAR_", "OMP_", "TF_CPP", "TF_NUM", "TF_ENABLE")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostnames": sorted(set(comm.allgather(socket.gethostname()))),
        "nproc": os.cpu_count(), "cpu": cpu, "ranks": comm.Get_size(),
        "platform": platform.platform(), "python": platform.python_version(),
        "numpy": np.__version__, "tensorflow": tf.__version__,
        "kerasdist": getattr(kd, "__version__", "?"), "mpi4py": mpi4py.__version__,
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)},
        "kerasdist_config": getattr(getattr(sys.modules.get("kerasdist.common.basics"), "context", None),
                                     "config", None),
    }


def print_report(rows, grouped, floors, size):
    """Prints the table, the 4 KiB latency lines and the grouped step."""
    cols = " | ".join(f"{'time':>9} {'busGB/s':>8}" for _ in range(3))
    sub = f"{'':>8} | {cols} | {'GB/s':>7} | {'fn/MPICH':>8} | {'fn/memcp':>8}"
    print(f"\nkerasdist allreduce, float32, op=Sum, {size} ranks; time per op = max "
          "over ranks of min over blocks of block medians; ratios are of bandwidth, "
          "kd tf.function over MPICH and over memcpy")
    print(f"{'size':>8} | {'kd eager':^18} | {'kd tf.function':^18} | {'MPICH':^18} | "
          f"{'memcpy':>7} | {'ratio':>8} | {'ratio':>8}", sub, "-" * len(sub), sep="\n")
    for r in rows:
        cells = " | ".join(f"{fmt_time(r[k + '_s']):>9} {r[k + '_busbw_GBps']:8.2f}"
                           for k in ("kd_eager", "kd_fn", "mpich"))
        print(f"{fmt_size(r['bytes']):>8} | {cells} | {r['memcpy_GBps']:7.2f} | "
              f"{r['bw_ratio_kd_fn_over_mpich']:8.2f} | {r['bw_ratio_kd_fn_over_memcpy']:8.3f}")
    for r in (r for r in rows if r["bytes"] == 4 * KIB):
        print(f"\nLatency of one 4 KiB allreduce: kd eager {fmt_time(r['kd_eager_s']).strip()}, "
              f"kd tf.function {fmt_time(r['kd_fn_s']).strip()}, "
              f"MPICH {fmt_time(r['mpich_s']).strip()}")
    if floors:
        f = {k: fmt_time(v).strip() for k, v in floors.items()}
        print(f"TensorFlow's floors at 4 KiB: eager tf.identity {f['tf eager identity']}; "
              f"one while-loop iteration (a multiply) {f['tf.function loop iteration (multiply)']}; "
              f"kd tf.function with one allreduce per iteration "
              f"{f['kd tf.function 1 per iteration']} (chained {CHAIN} per iteration above)")
    print("\nOne step of 100 tensors of 4 KiB vs one tensor of 400 KiB (time per step):")
    for name, t in grouped.items():
        print(f"  {name:<34} {fmt_time(t)}")
    net = collective_shares(grouped)
    print(f"  kerasdist's share (step minus the same function without the collective):\n"
          f"    100x4 KiB {fmt_time(net['many_s']).strip()}, 1x400 KiB "
          f"{fmt_time(net['one_s']).strip()}, ratio {net['ratio']:.2f}")


def collective_shares(grouped):
    """The collectives' share of the `tf.function` steps and their ratio.

    The 100-tensor step minus the same split and concat without the
    allreduce, and the single-tensor step minus a call of `tf.identity`:
    what remains is the time the collectives add to a step.
    """
    g = grouped
    many = (g[f"kd tf.function {GROUP_COUNT}x{fmt_size(GROUP_BYTES)}"]
            - g["tf.function split+concat only"])
    one = (g[f"kd tf.function 1x{fmt_size(GROUP_COUNT * GROUP_BYTES)}"]
           - g["tf.function identity only"])
    return {"many_s": many, "one_s": one, "ratio": many / one if one > 0 else math.inf}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", type=parse_size, default=DEFAULT_SIZES,
                   metavar="SIZE", help="Buffer sizes, e.g. 4K 1M 64MiB.")
    p.add_argument("--iters", type=int, metavar="N",
                   help="Timed samples per block (default: chosen from the warmup).")
    p.add_argument("--blocks", type=int, metavar="B",
                   help="Interleaved timed blocks per method (default 5, quick 3).")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="Results file (default benchmarks/results/allreduce_np{N}.json).")
    p.add_argument("--quick", action="store_true",
                   help="Short run for CI: fewer, shorter blocks; still checks sums.")
    args = p.parse_args(argv)
    if min(args.iters or 1, args.blocks or 1) < 1:
        p.error("--iters and --blocks must be at least 1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from mpi4py import MPI
    import tensorflow as tf
    import kerasdist as kd

    start = time.perf_counter()
    kd.init()
    comm = MPI.COMM_WORLD
    bench = Bench(comm, args)
    rows, status = [], 0
    try:
        for nbytes in args.sizes:
            rows.append(bench_size(nbytes, bench, comm, kd, tf))
        grouped = bench_grouped(bench, comm, kd, tf)
        floors = bench_floors(bench, kd, tf) if 4 * KIB in args.sizes else None
    except AssertionError as e:
        if comm.Get_rank() == 0:
            print(f"FAILED correctness check: {e}", file=sys.stderr)
        grouped, floors, status = None, None, 1
    elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
    info, size = machine_info(comm, kd, tf), comm.Get_size()
    if comm.Get_rank() == 0 and status == 0:
        print_report(rows, grouped, floors, size)
        print(f"\nTotal benchmark time (after imports): {elapsed:.1f} s")
        path = os.path.abspath(args.json or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results", f"allreduce_np{size}.json"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"machine": info, "args": vars(args), "elapsed_s": elapsed,
                       "sizes": rows, "grouped_step_s": grouped,
                       "grouped_collective_share": collective_shares(grouped),
                       "chain_per_iteration": CHAIN, "floors_4k_s": floors}, f, indent=2)
        print(f"Wrote {path}")
    kd.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main())
