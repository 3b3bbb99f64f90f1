"""shutdown() then init() again, init() twice, sub-communicators, timeline."""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import kerasdist as kd
from _util import log, main


def total(name):
    return kd.allreduce(tf.ones([3]), op=kd.Sum, name=name).numpy()


def run():
    size, r = kd.size(), kd.rank()
    kd.init()  # twice is harmless
    np.testing.assert_array_equal(total("a"), np.full(3, size, np.float32))
    for cycle in range(2):
        kd.shutdown()
        assert not kd.is_initialized()
        try:
            kd.rank()
            raise AssertionError("rank() after shutdown() should fail")
        except RuntimeError as e:
            assert "kerasdist.init()" in str(e)
        kd.init()
        np.testing.assert_array_equal(total(f"b{cycle}"), np.full(3, size, np.float32))
    # A sub-communicator given as a list of ranks.
    if size >= 3:
        kd.shutdown()
        members = [0, 1]
        if r in members:
            kd.init(comm=members)
            assert kd.size() == 2 and kd.rank() == r
            np.testing.assert_array_equal(total("sub"), np.full(3, 2.0, np.float32))
            kd.shutdown()
        # Ranks that pass different lists fail at once, on every member,
        # naming the lists, and the engine starts normally afterwards.
        lists = {0: [0, 1], 1: [0, 1, 2], 2: [0, 1, 2]}
        if r in lists:
            try:
                kd.init(comm=lists[r])
                raise AssertionError("init() with differing comm lists should fail")
            except ValueError as e:
                assert "must pass the same list" in str(e), e
                assert "comm=[0, 1]" in str(e), e
                assert not kd.is_initialized()
        kd.init()
        kd.barrier()
        np.testing.assert_array_equal(total("after"), np.full(3, size, np.float32))
    path = os.environ.get("KERASDIST_TIMELINE")
    if path:
        step = tf.function(lambda ts: kd.grouped_allreduce(ts, name="tl"))
        for _ in range(3):
            step([tf.ones([100]) for _ in range(4)])
        # Eager grouped_allreduce reaches the engine as one batch: fused.
        kd.grouped_allreduce([tf.ones([100]) for _ in range(4)], name="eg")
        # Past KERASDIST_SMALL_ALLREDUCE_BYTES (32 KiB) the ring runs.
        kd.allreduce(tf.ones([16384]), name="big")
        kd.shutdown()  # closes the file
        if r == 0:
            with open(path) as f:
                events = json.load(f)
            names = {e["name"] for e in events}
            for want in ("small_allreduce", "ring_reduce_scatter", "ring_allgather",
                         "memcpy_in_fusion_buffer"):
                assert want in names, (want, names)
            assert any(e.get("args", {}).get("tensors", "").startswith("tl.") for e in events)
            negotiations = [e for e in events if e.get("tid") == 1 and e["name"] == "tl.0"]
            assert negotiations and negotiations[0]["args"] == {"op": "allreduce"}, negotiations
            fused = [e for e in events if e["name"] == "memcpy_in_fusion_buffer"
                     and e.get("args", {}).get("tensors", "").startswith("eg.")]
            assert fused and fused[0]["args"]["tensors"].count("eg.") == 4, fused
        kd.init()
        if r == 0:
            log("timeline events:", len(events))


main(run)
