"""`ElasticSampler`: Horovod's sampler that remembers how far an epoch got."""

import math
import random

import torch

from kerasdist.common.basics import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset's indices over the ranks (like
    `DistributedSampler`) and resumes a partly done epoch after a restart.

    Keep it in a `TorchState` (as an attribute), call `record_batch()`
    after each batch and `set_epoch()` at the end of each epoch. A restarted
    job then splits only the indices of this epoch not yet processed.

    Args:
        dataset: The dataset (of a fixed length).
        shuffle: Shuffle the indices, with `seed + epoch`. Defaults to True.
        seed: The same on every rank. Defaults to 0.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch` (call it at the end of the previous one)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Counts a batch of `batch_size` samples on every rank as done."""
        del batch_idx
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        """Splits this epoch's remaining indices over the current ranks."""
        self.num_replicas, self.rank = size(), rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = list(self.remaining_indices)
        indices += indices[:self.total_size - len(indices)]  # pad to a multiple
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples
