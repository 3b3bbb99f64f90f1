"""One engine per process, whatever binding reaches it.

Rank 0 runs each collective as a TensorFlow op, rank 1 through the engine
library's C API from Python (kerasdist/common/handles.py), under the same
names: they can only meet if both bindings reach the same engine and its
coordinator. The process maps one libkerasdist.so, and the TensorFlow op
library maps no engine of its own.
"""

import numpy as np
import tensorflow as tf

import kerasdist as kd
from kerasdist.common import handles

kd.init()
rank, size = kd.rank(), kd.size()
assert size == 2, size
expected = np.arange(12, dtype=np.float32).reshape(3, 4) * 3  # rank 0's x1 + rank 1's x2

for step in range(5):  # the repeats run on the direct board once cached
    x = np.arange(12, dtype=np.float32).reshape(3, 4) * (rank + 1)
    if rank == 0:
        out = kd.allreduce(tf.constant(x), op=kd.Sum, name="shared.allreduce").numpy()
    else:
        out = np.empty_like(x)
        handles.enqueue([handles.request(handles.ALLREDUCE, "shared.allreduce", x, out)]).wait()
    assert np.array_equal(out, expected), (step, out)

rows = np.full((rank + 2, 3), rank, dtype=np.int64)
if rank == 0:
    gathered = kd.allgather(tf.constant(rows), name="shared.allgather").numpy()
else:
    gathered = handles.enqueue([handles.request(
        handles.ALLGATHER, "shared.allgather", rows)]).wait().output(0, np.int64)
assert np.array_equal(gathered, np.concatenate([np.full((2, 3), 0), np.full((3, 3), 1)]))

maps = [line.split()[-1] for line in open("/proc/self/maps") if "libkerasdist" in line]
assert len(set(maps)) == 1, sorted(set(maps))
assert kd.build_info()["ops"], kd.build_info()
print(f"rank {rank}: one engine ok ({maps[0]})", flush=True)
