"""CPU time from /proc for `keras_synthetic.py`: the process, each thread
by name (kerasdist's engine thread is `kd-engine`) and the whole machine."""

import os


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
