"""MetricAverageCallback at np>=2: plain and weighted means, key checks."""

import numpy as np

import kerasdist as kd
from kerasdist.callbacks.metric_average import MetricAverageCallback
from _util import log, main
from cb_common import Recorder, data, make_model

KEYS = ("loss", "mae", "val_loss", "val_mae")


def fit_and_gather(weighted, train_batches, val_batches):
    """Plain (not distributed) fit per rank; returns raw logs of all ranks."""
    r = kd.rank()
    x, y = data(8 * train_batches, seed=r)
    vx, vy = data(4 * val_batches, seed=10 + r)
    raw, avg = Recorder(), Recorder()
    make_model(seed=r).fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False,
                           validation_data=(vx, vy), validation_batch_size=4,
                           callbacks=[raw, MetricAverageCallback(weighted), avg])
    all_raw = kd.allgather_object(raw.logs, name=f"test.raw.{weighted}")
    assert raw.batches == 2 * train_batches
    return all_raw, avg.logs


def check_plain():
    all_raw, avg = fit_and_gather(False, 4, 2)
    for epoch, logs in enumerate(avg):
        for key in KEYS:
            values = [ranks[epoch][key] for ranks in all_raw]
            assert len(set(values)) == kd.size(), ("ranks should differ", values)
            np.testing.assert_allclose(logs[key], np.mean(values), rtol=1e-6)
    log("plain mean ok:", {k: round(v, 4) for k, v in avg[-1].items()})


def check_weighted():
    # Rank r runs 3 + 2r training and 1 + r validation batches (full ones).
    r, size = kd.rank(), kd.size()
    train = [3 + 2 * k for k in range(size)]
    val = [1 + k for k in range(size)]
    all_raw, avg = fit_and_gather(True, train[r], val[r])
    for epoch, logs in enumerate(avg):
        for key in KEYS:
            w = np.array(val if key.startswith("val_") else train, np.float64)
            values = np.array([ranks[epoch][key] for ranks in all_raw])
            np.testing.assert_allclose(logs[key], (values * w).sum() / w.sum(), rtol=1e-6)
            assert not np.isclose(logs[key], values.mean(), rtol=1e-6)
    log("weighted mean ok")


def check_synthetic():
    r, size = kd.rank(), kd.size()
    cb = MetricAverageCallback(weighted=True)
    cb.on_epoch_begin(0)
    for b in range(2 + r):
        cb.on_train_batch_end(b)
    logs = {"loss": float(r), "val_loss": 10.0 * r, "vec": np.array([r, 2.0 * r]),
            "name": f"rank{r}"}
    cb.on_epoch_end(0, logs)  # no validation batches anywhere: plain mean
    w = np.array([2 + k for k in range(size)], np.float64)
    np.testing.assert_allclose(logs["loss"], (np.arange(size) * w).sum() / w.sum())
    np.testing.assert_allclose(logs["val_loss"], 10.0 * np.mean(range(size)))
    np.testing.assert_allclose(logs["vec"], np.outer(np.arange(size), [1, 2]).T @ w / w.sum())
    assert logs["name"] == f"rank{r}"


def check_key_errors():
    r = kd.rank()
    cb = MetricAverageCallback()
    cases = [({"loss": 1.0, **({"extra_metric": 2.0} if r == 1 else {})},
              "keys missing on some ranks: ['extra_metric']"),
             ({"loss": 1.0, "odd": "x" if r == 0 else 3.0},
              "keys numeric on some ranks only: ['odd']")]
    for logs, needle in cases:
        try:
            cb.on_epoch_end(4, logs)
        except ValueError as e:
            assert needle in str(e) and "epoch 5" in str(e), str(e)
        else:
            raise AssertionError("expected a ValueError on every rank")
    cb.on_epoch_end(5, {"loss": float(r)})  # still in step afterwards
    log("key mismatch errors ok")


def run():
    check_plain()
    check_weighted()
    check_synthetic()
    check_key_errors()


main(run)
