"""``DistributedSampler``: the indices of one streaming worker's shard of a dataset.

It draws the same indices as ``torch.utils.data.DistributedSampler`` with the same
arguments: one permutation of the dataset per epoch (``torch.randperm`` seeded with
``seed + epoch``, the same on every worker) or the identity, cut or cyclically padded
to a multiple of ``num_replicas``, of which replica ``rank`` takes every
``num_replicas``-th index from position ``rank``. Only the defaults differ: cerebrax
runs one process per host and streams from worker threads, so ``num_replicas`` and
``rank`` default to ``cstorch.distributed.num_streamers()`` and
``get_streaming_rank()`` of the worker whose ``input_fn`` builds the sampler (rank 0 on
the user node) instead of the ``torch.distributed`` world. With ``batch_size`` it
yields lists of indices, for a torch ``DataLoader(batch_sampler=...)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._filters import check_int
from ..errors import ConfigError
from ._streamers import get_streaming_rank, is_streamer, num_streamers

__all__ = ["DistributedSampler", "pad_index"]

#: The index a sampler yields for a padding sample (``pad_last``): never a valid index of
#: a dataset's ``range(len(dataset))``.
pad_index: int = -1


class DistributedSampler:
    """Samples one replica's share of a map-style dataset, reshuffled every epoch.

    Args:
      data_source: the dataset (anything with ``len``).
      num_replicas: how many shards (default: ``num_streamers()``; 1 with
        ``shard=False``).
      rank: this shard, in ``[0, num_replicas)`` (default: ``get_streaming_rank()`` in
        a streaming worker, 0 on the user node and with ``shard=False``).
      shuffle: draw a new permutation every epoch (``set_epoch``, which the cstorch
        DataLoader calls at the start of every epoch).
      seed: the permutation's seed, the same on every replica.
      drop_last: cut the dataset to a multiple of ``num_replicas`` (else pad it with
        its first indices); with ``batch_size``, also drop a last partial batch.
      batch_size: yield lists of this many indices (a batch sampler) instead of indices.
      shard: split the data over the streaming workers; False gives every worker all of
        it.
      num_samples: the size of each epoch (over all replicas) when it is not the
        dataset's: the dataset's order is cut to it, or extended with copies of itself
        (cstorch's meaning). Only without ``shuffle``: cstorch's shuffled order over
        several copies is not reproduced, so that combination is refused.
      pad_last: with ``batch_size`` and without ``drop_last``, fill the last partial
        batch with ``pad_index`` (``cstorch.utils.data.sampler.pad_index``), for which a
        cstorch dataset builds a padding sample, so every batch is full.

    Example:
      >>> from cerebrax.utils.data import DistributedSampler
      >>> sampler = DistributedSampler(range(10), num_replicas=3, rank=1, shuffle=False)
      >>> list(sampler), len(sampler)              # 10 indices padded to 12 with index 0
      ([1, 4, 7, 0], 4)
    """

    def __init__(
        self,
        data_source: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        batch_size: int | None = None,
        shard: bool = True,
        num_samples: int | None = None,
        pad_last: bool = False,
    ):
        try:
            size = len(data_source)
        except TypeError:
            raise ConfigError(
                f"DistributedSampler needs a dataset with a length (a map-style dataset), "
                f"got {type(data_source).__name__}. An iterable dataset shards itself: "
                "select its items with cstorch.distributed.get_streaming_rank()."
            ) from None
        if not shard:
            if num_replicas not in (None, 1) or rank not in (None, 0):
                raise ConfigError(
                    f"DistributedSampler(shard=False) gives every worker all the data, but "
                    f"num_replicas={num_replicas!r}, rank={rank!r} ask for a shard. Drop "
                    "them, or use shard=True."
                )
            num_replicas, rank = 1, 0
        if num_replicas is None:
            num_replicas = num_streamers()
        if rank is None:
            rank = get_streaming_rank() if is_streamer() else 0
        self.num_replicas = check_int("DistributedSampler(num_replicas=...)", num_replicas, ge=1)
        self.rank = check_int("DistributedSampler(rank=...)", rank, ge=0)
        if self.rank >= self.num_replicas:
            raise ConfigError(
                f"DistributedSampler(rank={rank}) is out of range for "
                f"num_replicas={num_replicas}: ranks are 0 to {num_replicas - 1}."
            )
        self.batch_size = check_int("DistributedSampler(batch_size=...)", batch_size,
                                    ge=1, optional=True)
        self.data_source = data_source
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch_size = check_int("DistributedSampler(num_samples=...)", num_samples,
                                    ge=1, optional=True)
        if self.epoch_size is not None and self.shuffle:
            raise ConfigError(
                f"DistributedSampler(num_samples={num_samples}, shuffle=True) shuffles "
                "copies of the dataset together in an order cerebrax does not reproduce. "
                "Pass shuffle=False, or leave num_samples unset (one epoch is the dataset).")
        self.pad_last = bool(pad_last)
        if self.pad_last and (self.batch_size is None or self.drop_last):
            raise ConfigError(
                "DistributedSampler(pad_last=True) pads the last partial batch, so it needs "
                f"batch_size and drop_last=False (got batch_size={batch_size!r}, "
                f"drop_last={drop_last!r}).")
        self.epoch = 0
        if self.epoch_size is not None:
            size = self.epoch_size
        if drop_last and size % self.num_replicas:
            self.num_samples = math.ceil((size - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(size / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Makes the next pass draw the permutation of ``epoch``."""
        self.epoch = epoch

    def _order(self) -> np.ndarray:
        size = len(self.data_source)
        if not self.shuffle:
            order = np.arange(size)
            # cut, or extended with copies of the dataset
            return order if self.epoch_size is None else np.resize(order, self.epoch_size)
        try:
            import torch
        except ImportError:
            raise ConfigError(
                "DistributedSampler(shuffle=True) draws torch's permutation (the same "
                "order as torch.utils.data.DistributedSampler), so it needs torch: pip "
                "install torch, or pass shuffle=False."
            ) from None
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(size, generator=generator).numpy()

    def indices(self) -> list[int]:
        """This replica's indices for the current epoch."""
        # np.resize repeats the order cyclically to pad it, or cuts it.
        return np.resize(self._order(), self.total_size)[self.rank::self.num_replicas].tolist()

    def __iter__(self) -> Iterator[Any]:
        indices = self.indices()
        if self.batch_size is None:
            yield from indices
            return
        b = self.batch_size
        stop = len(indices) - len(indices) % b if self.drop_last else len(indices)
        for start in range(0, stop, b):
            batch = indices[start:start + b]
            if self.pad_last and len(batch) < b:
                batch = batch + [pad_index] * (b - len(batch))
            yield batch

    def __len__(self) -> int:
        if self.batch_size is None:
            return self.num_samples
        if self.drop_last:
            return self.num_samples // self.batch_size
        return math.ceil(self.num_samples / self.batch_size)
