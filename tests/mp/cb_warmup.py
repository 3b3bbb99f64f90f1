"""LearningRateWarmupCallback at np>=2 follows Horovod's formula per batch."""

import numpy as np

import kerasdist as kd
from kerasdist.callbacks.lr_schedule import LearningRateScheduleCallback
from kerasdist.callbacks.lr_warmup import LearningRateWarmupCallback
from kerasdist import LinearWarmup
from _util import log, main
from cb_common import Recorder, data, make_model


def expected(initial_lr, warmup_epochs, epochs, steps):
    size, out = kd.size(), []
    for epoch in range(epochs):
        for batch in range(steps):
            e = epoch + batch / steps
            if e < warmup_epochs:
                out.append(initial_lr / size * (e * (size - 1) / warmup_epochs + 1))
            else:
                out.append(None)  # after the warmup: initial_lr or a schedule's
    return out


def run():
    r, size = kd.rank(), kd.size()
    x, y = data(32, seed=r)
    lr = 0.1 * size
    # Whole epochs; a schedule callback takes over after the warmup.
    rec = Recorder()
    # A real distributed fit: compiled step, gradients averaged over ranks.
    model = make_model(lr=123.0, run_eagerly=False, distributed=True)
    model.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[
        LearningRateWarmupCallback(lr, warmup_epochs=2, verbose=1),
        LearningRateScheduleCallback(lr, 0.5, start_epoch=3),
        rec])
    want = expected(lr, 2, 4, 4)
    want[8:12] = [lr] * 4       # end of warmup: exactly initial_lr
    want[12:] = [lr * 0.5] * 4  # the schedule from epoch 3
    np.testing.assert_allclose(rec.lrs, want, rtol=1e-6)
    weights = kd.allgather_object([w.numpy() for w in model.weights], name="test.w")
    for w0, w1 in zip(*weights[:2]):
        np.testing.assert_allclose(w0, w1, rtol=1e-6)
    assert rec.lrs[0] == np.float32(lr / size)
    np.testing.assert_allclose([log_["learning_rate"] for log_ in rec.logs],
                               [want[3], lr, lr, lr / 2],
                               rtol=1e-6)
    # Fractional warmup ends inside an epoch; explicit steps_per_epoch.
    rec = Recorder()
    make_model(lr=123.0).fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[
        LearningRateWarmupCallback(lr, warmup_epochs=1.5, steps_per_epoch=4), rec])
    want = expected(lr, 1.5, 2, 4)
    want[6:] = [lr, lr]
    np.testing.assert_allclose(rec.lrs, want, rtol=1e-6)
    # The schedule form: world size taken from kerasdist at construction.
    schedule = LinearWarmup(lr, warmup_steps=8)
    assert schedule.world_size == size
    np.testing.assert_allclose([float(schedule(s)) for s in (0, 4, 8)],
                               [0.1, lr / size * (4 * (size - 1) / 8 + 1), lr], rtol=1e-6)
    log("warmup lrs:", np.round(rec.lrs, 4).tolist())


main(run)
