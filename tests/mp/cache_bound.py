"""The response cache stays bounded (KERASDIST_CACHE_CAPACITY=32 here) and
correct while names come and go: unique names, 50 recurring names (more than
the capacity, so they are evicted and announced again), unnamed eager calls,
and a recurring name whose shape changes. Evicted ids are reused only once
every rank has forgotten them, so every value must stay exact."""

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main
from kerasdist.common.basics import context


def run():
    size, r = kd.size(), kd.rank()
    total = size * (size - 1) // 2
    for i in range(900):
        n = 1 + (i * 7) % 13
        if i % 3 == 0:
            name = f"unique.{i}"
        elif i % 3 == 1:
            name = f"recurring.{i % 50}"
        else:
            name = None
        if i % 97 == 0:
            n += 5  # the same recurring name with another shape
        x = np.full(n, r + i, np.float32)
        got = kd.allreduce(tf.constant(x), op=kd.Sum, name=name).numpy()
        np.testing.assert_array_equal(got, np.full(n, total + size * i, np.float32),
                                      err_msg=f"op {i} name {name}")
        if i % 100 == 99:
            entries = context.lib.kerasdist_cache_entries()
            assert 0 < entries <= 32, (i, entries)
    log("cache checks passed")


main(run)
