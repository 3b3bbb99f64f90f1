"""Summarizes benchmarks/ab_engine_library.sh's runs: for each allreduce
size, the after/before ratio of kd eager and kd tf.function times, each
also against MPICH measured in the same run (fn/MPICH), per round; and the
model-level samples/s. Prints a table and writes summary.json beside the
runs."""

import glob
import json
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ab_engine_library")


def load(np_, tag, rnd):
    path = os.path.join(OUT, f"allreduce_np{np_}_{tag}_r{rnd}.json")
    return json.load(open(path)) if os.path.exists(path) else None


def main():
    rows, summary = [], {"allreduce": [], "keras": {}}
    for np_ in (2, 3):
        for rnd in (1, 2):
            before, after = load(np_, "before", rnd), load(np_, "after", rnd)
            if not before or not after:
                continue
            for b, a in zip(before["sizes"], after["sizes"]):
                rec = {"np": np_, "round": rnd, "bytes": b["bytes"],
                       "eager_after_over_before": a["kd_eager_s"] / b["kd_eager_s"],
                       "fn_after_over_before": a["kd_fn_s"] / b["kd_fn_s"],
                       "fn_over_mpich_before": b["kd_fn_s"] / b["mpich_s"],
                       "fn_over_mpich_after": a["kd_fn_s"] / a["mpich_s"]}
                summary["allreduce"].append(rec)
                rows.append(rec)
    print("time ratios after/before (< 1: after faster); fn/MPICH: time of kd tf.function "
          "over MPICH's in the same run")
    print(f"{'np':>2} {'rnd':>3} {'size':>9} {'eager a/b':>10} {'fn a/b':>8} "
          f"{'fn/MPICH b':>11} {'fn/MPICH a':>11}")
    for r in rows:
        print(f"{r['np']:>2} {r['round']:>3} {r['bytes']:>9} {r['eager_after_over_before']:>10.2f} "
              f"{r['fn_after_over_before']:>8.2f} {r['fn_over_mpich_before']:>11.2f} "
              f"{r['fn_over_mpich_after']:>11.2f}")
    print("\nmodel level (mnist, samples/s): kd np=2 x1 thread, and 2 independent Keras "
          "processes x1 thread (the ceiling), per round")
    print(f"{'rnd':>3} {'kd before':>10} {'kd after':>9} {'a/b':>5} {'2 procs b':>10} "
          f"{'2 procs a':>10} {'kd/2procs b':>12} {'kd/2procs a':>12}")
    for rnd in (1, 2, 3, 4):
        got = {}
        for tag in ("before", "after"):
            path = os.path.join(OUT, f"keras_mnist_{tag}_r{rnd}.json")
            if os.path.exists(path):
                res = json.load(open(path))["results"]["mnist"]
                got[tag] = {c: res[c]["samples_per_s"] for c in ("kd_np2_t1", "keras_2x_t1")
                            if c in res}
        if len(got) < 2:
            continue
        b, a = got["before"], got["after"]
        rec = {"round": rnd, "before": b, "after": a,
               "kd_after_over_before": a["kd_np2_t1"] / b["kd_np2_t1"]}
        summary["keras"].setdefault("rounds", []).append(rec)
        print(f"{rnd:>3} {b['kd_np2_t1']:>10.1f} {a['kd_np2_t1']:>9.1f} "
              f"{rec['kd_after_over_before']:>5.2f} {b['keras_2x_t1']:>10.1f} "
              f"{a['keras_2x_t1']:>10.1f} {b['kd_np2_t1'] / b['keras_2x_t1']:>12.2f} "
              f"{a['kd_np2_t1'] / a['keras_2x_t1']:>12.2f}")
    with open(os.path.join(OUT, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
