"""Resident memory per eager collective, by naming (found by the soak).

    mpiexec -n 2 python tests/mp/eager_name_rss.py MODE [N]

MODE: fixed (one name), fresh (name=f"x.{i}"), unnamed (name=None, numbered
in call order). After 300 warm-up calls it runs N (default 3000) eager
allreduces of 4 floats and prints RSS growth per op; it exits 1 if the
growth exceeds 2 KiB/op. Seen: fixed 0.00 KiB/op; fresh and unnamed
~36 KiB/op at np=1 and np=2, flat again when TensorFlow's eager kernel cache
is cleared, so each distinct `tensor_name` attr keeps a kernel forever.
"""

import sys

import tensorflow as tf

import kerasdist as kd
from _util import log, main

LIMIT_KIB_PER_OP = 2.0


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def run():
    mode = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    x = tf.ones([4])

    def call(i):
        name = {"fixed": "rss.fixed", "fresh": f"rss.fresh.{i}", "unnamed": None}[mode]
        return kd.allreduce(x, op=kd.Sum, name=name)

    for i in range(300):
        call(-1 - i)
    before = rss_kib()
    for i in range(n):
        call(i)
    per_op = (rss_kib() - before) / n
    log(f"{mode}: {n} eager allreduces, RSS {before / 1024:.1f} MiB + "
        f"{per_op:.2f} KiB/op")
    if per_op > LIMIT_KIB_PER_OP:
        raise AssertionError(f"{mode} names: RSS grows {per_op:.2f} KiB per eager op "
                             f"(limit {LIMIT_KIB_PER_OP})")


main(run)
