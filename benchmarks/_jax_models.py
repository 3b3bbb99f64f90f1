"""The JAX benchmark's model-level worker (one rank of Keras on JAX).

Run by benchmarks/jax_keras.py, never directly:
    python _jax_models.py <config> <model> <steps> <warmup> <json> [quick]
config: kd (kerasdist's DistributedOptimizer, under mpiexec), dp
(`keras.distribution.DataParallel` over `jax.distributed` with gloo CPU
collectives, under mpiexec; the coordinator at $BENCH_JAX_COORDINATOR) or
plain (one process, no communication). The models and synthetic batches
are those of benchmarks/keras_synthetic.py (benchmarks/_synthetic_models.py).
Each rank trains with `train_on_batch` on its own fixed batch; the samples/s
of the timed steps (all ranks' examples) go to <json>.
"""

import json
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from _synthetic_models import build_model, make_optimizer, synthetic_batch  # noqa: E402
from keras_synthetic import MODELS  # noqa: E402


def main():
    config, name, steps, warmup, out = sys.argv[1:6]
    quick = len(sys.argv) > 6
    steps, warmup = int(steps), int(warmup)
    spec = MODELS[name]
    batch = spec["quick_batch" if quick else "batch"]
    rank, size = 0, 1
    if config == "kd":
        import kerasdist as kd
        kd.init()
        rank, size = kd.rank(), kd.size()
    elif config == "dp":
        from mpi4py import MPI
        rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=os.environ["BENCH_JAX_COORDINATOR"],
                                   num_processes=size, process_id=rank)
    import keras
    keras.utils.set_random_seed(1)  # the same initial weights on every rank
    if config == "dp":
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False))
    model, shape = build_model(keras, name, spec, quick)
    opt = make_optimizer(keras, name, size)
    if config == "kd":
        opt = kd.DistributedOptimizer(opt)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    x, y = synthetic_batch(np, name, spec, shape, batch, 100 + rank, quick)
    for _ in range(warmup):
        model.train_on_batch(x, y)
    jax.block_until_ready([v.value for v in model.trainable_variables])
    if config == "kd":
        kd.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        loss = model.train_on_batch(x, y)
    jax.block_until_ready([v.value for v in model.trainable_variables])
    seconds = time.perf_counter() - start
    if config == "kd":
        seconds = max(kd.allgather_object(seconds))
    digest = float(np.sum([np.sum(np.asarray(v)) for v in model.trainable_variables]))
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"samples_per_s": steps * batch * size / seconds, "seconds": seconds,
                       "loss": float(loss), "weights_sum": digest, "ranks": size,
                       "batch_per_rank": batch}, f)
    if config == "dp":
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
