"""SyncStopTrainingCallback at np>=2: a stop on one rank stops all ranks."""

import keras

import kerasdist as kd
from kerasdist.callbacks.stop_sync import SyncStopTrainingCallback
from _util import log, main
from cb_common import Recorder, data, make_model


class StopOn(keras.callbacks.Callback):
    """Sets stop_training on one rank only, at an epoch end or a batch end."""

    def __init__(self, rank, epoch=None, batch=None):
        super().__init__()
        self.rank, self.epoch, self.batch, self.current = rank, epoch, batch, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (kd.rank() == self.rank and self.batch is not None
                and (self.current, batch) == (self.epoch, self.batch)):
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if kd.rank() == self.rank and self.batch is None and epoch == self.epoch:
            self.model.stop_training = True


def fit(stopper):
    x, y = data(32, seed=kd.rank())
    rec = Recorder()
    make_model().fit(x, y, batch_size=8, epochs=5, verbose=0, callbacks=[
        stopper, rec, SyncStopTrainingCallback()])
    return kd.allgather_object((rec.epochs, rec.batches), name="test.counts")


def run():
    size = kd.size()
    # EarlyStopping-like: rank 0 stops at the end of epoch 1 (the 2nd).
    counts = fit(StopOn(rank=0, epoch=1))
    assert counts == [(2, 8)] * size, counts
    # TerminateOnNaN-like: the last rank stops after batch 2 of epoch 1.
    counts = fit(StopOn(rank=size - 1, epoch=1, batch=2))
    assert counts == [(2, 7)] * size, counts
    # Nobody stops: all epochs run.
    counts = fit(StopOn(rank=0, epoch=99))
    assert counts == [(5, 20)] * size, counts
    log("stop sync ok")


main(run)
