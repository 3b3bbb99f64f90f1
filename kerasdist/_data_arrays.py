"""Sharding for numpy inputs and PyTorch `DataLoader`s, for any Keras
backend and for kerasdist.torch (exported by `kerasdist.data`).

Both give every rank the same number of examples, so every rank runs the
same number of steps per epoch and no rank waits for gradients that never
come. They need numpy only.
"""

import numpy as np

from kerasdist.common import basics


def shard_arrays(*arrays, drop_remainder=True):
    """This rank's share of numpy arrays: every `size()`-th example.

    Args:
        *arrays: Arrays (or anything with `len()` and slicing, e.g. numpy
            arrays) of the same length, in the same order on every rank.
        drop_remainder: Drop the last `len % size()` examples so that every
            rank gets the same number (True), or keep them, giving the first
            ranks one example more (False). Defaults to True.

    Returns:
        This rank's slice of each array (one array, or a tuple for several).

    Raises:
        ValueError: If the arrays differ in length, or there are fewer
            examples than ranks.

    Example:

    >>> x_train, y_train = kerasdist.data.shard_arrays(x_train, y_train)  # doctest: +SKIP
    >>> model.fit(x_train, y_train, batch_size=64)  # doctest: +SKIP
    """
    if not arrays:
        raise ValueError("`shard_arrays` needs at least one array.")
    lengths = [len(a) for a in arrays]
    if len(set(lengths)) > 1:
        raise ValueError(
            "All arrays given to `shard_arrays` must have the same length. "
            f"Received lengths: {lengths}")
    n, count = lengths[0], basics.size()
    if n < count:
        raise ValueError(
            f"Cannot shard {n} examples over {count} ranks: every rank needs at "
            "least one.")
    end = n - n % count if drop_remainder else n
    out = tuple(a[basics.rank():end:count] for a in arrays)
    return out[0] if len(out) == 1 else out


class DistributedSampler:
    """A `DataLoader` sampler giving this rank its share of a dataset.

    PyTorch's own `DistributedSampler` asks `torch.distributed` for the
    rank and world size (and so needs a process group); this one takes them
    from kerasdist. As PyTorch's, it pads (or with `drop_last`, trims) the
    indices so that every rank gets the same number, shuffles with a seed
    shared by every rank, and reshuffles per epoch with `set_epoch`.

    Args:
        dataset: The dataset (anything with `len()`), or its length.
        shuffle: Shuffle the indices every epoch. Defaults to True.
        seed: The shuffle's seed, the same on every rank. Defaults to 0.
        drop_last: Drop the tail that does not divide evenly (True) or pad
            with the first indices again (False). Defaults to False.
        num_replicas, rank: The ranks sharing the dataset and this rank's
            place among them. Default to `kerasdist.size()` and `rank()`.

    Example:

    >>> sampler = kerasdist.data.DistributedSampler(train_set, seed=42)  # doctest: +SKIP
    >>> loader = torch.utils.data.DataLoader(train_set, batch_size=64, sampler=sampler)  # doctest: +SKIP
    >>> for epoch in range(epochs):  # doctest: +SKIP
    ...     sampler.set_epoch(epoch)
    ...     model.fit(loader, epochs=1)
    """

    def __init__(self, dataset, shuffle=True, seed=0, drop_last=False, num_replicas=None,
                 rank=None):
        n = dataset if isinstance(dataset, (int, np.integer)) else len(dataset)
        self.num_replicas = basics.size() if num_replicas is None else int(num_replicas)
        self.rank = basics.rank() if rank is None else int(rank)
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(
                f"Invalid value for argument `rank`. Expected an integer in [0, "
                f"{self.num_replicas}). Received: rank={rank!r}")
        if n < 1 or (drop_last and n < self.num_replicas):
            raise ValueError(
                f"Cannot share {n} examples among {self.num_replicas} ranks: every rank "
                "needs at least one.")
        self.total_examples = int(n)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch = 0
        if drop_last:
            self.num_samples = n // self.num_replicas
        else:
            self.num_samples = -(-n // self.num_replicas)

    def set_epoch(self, epoch):
        """Sets the epoch, which (with the seed) decides the shuffle."""
        self.epoch = int(epoch)

    def indices(self):
        """This rank's indices for the current epoch, as a numpy array."""
        n = self.total_examples
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(n)
        else:
            order = np.arange(n)
        total = self.num_samples * self.num_replicas
        if total > n:
            order = np.concatenate([order, np.resize(order, total - n)])
        return order[:total][self.rank::self.num_replicas]

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        return self.num_samples
