"""Measures the per-step cost of fit's stop/step-count guard (not a test).

Run: mpiexec -n 2 python tests/mp/stop_overhead.py [epochs] [rounds]

A small MNIST-like CNN on random 28x28 images, 64 per rank per step. Each
round times fit() with the guard and with Keras' own fit (the guard
bypassed), in alternating order, for two callback sets: none (the guard
agrees at epoch ends only) and TerminateOnNaN (a batch hook, so the guard
also agrees after every batch). Rank 0 prints the minimum and median ms/step
and their ratios (on a shared machine the minimum is the steadier figure),
and the time of the per-batch check alone (the guard's allreduce, repeated).
"""

import sys
import time

import keras
import numpy as np

import kerasdist as kd
from kerasdist._keras import fit_guard as _fit_guard
from _util import log, main

EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
STEPS, BATCH = 40, 64


def make_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(kd.DistributedOptimizer(keras.optimizers.Adam(1e-3)),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def timed_fit(model, x, y, callbacks, guarded):
    fit = model.fit if guarded else (
        lambda *a, **k: _fit_guard._ORIGINAL_FIT(model, *a, **k))
    kd.barrier()
    start = time.perf_counter()
    fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=False,
        callbacks=callbacks)
    elapsed = time.perf_counter() - start
    # The slowest rank decides the step time.
    return max(kd.allgather_object(elapsed, name="overhead.time")) / (EPOCHS * STEPS) * 1e3


def run():
    rng = np.random.default_rng(kd.rank())
    x = rng.random((STEPS * BATCH, 28, 28, 1), np.float32)
    y = rng.integers(0, 10, STEPS * BATCH)
    model = make_model()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # trace and warm up
    cases = {"no callbacks": lambda: [],
             "TerminateOnNaN": lambda: [keras.callbacks.TerminateOnNaN()]}
    times = {(c, g): [] for c in cases for g in (False, True)}
    for r in range(ROUNDS):
        for case, callbacks in cases.items():
            order = (False, True) if r % 2 == 0 else (True, False)
            for guarded in order:
                times[(case, guarded)].append(
                    timed_fit(model, x, y, callbacks(), guarded))
    guard = _fit_guard.FitGuard(False)
    guard.set_model(model)
    kd.barrier()
    start = time.perf_counter()
    for _ in range(500):
        guard._agree("kerasdist.fit.stop.batch")
    check_us = (time.perf_counter() - start) / 500 * 1e6
    if kd.rank() == 0:
        for case in cases:
            plain, guarded = times[(case, False)], times[(case, True)]
            log(f"{case}: ms/step keras fit min {min(plain):.2f} median "
                f"{np.median(plain):.2f}; guarded fit min {min(guarded):.2f} "
                f"median {np.median(guarded):.2f}; ratio of minima "
                f"{min(guarded) / min(plain):.4f}, of medians "
                f"{np.median(guarded) / np.median(plain):.4f}")
        log(f"per-batch stop check alone: {check_us:.1f} us")


main(run)
