"""``cstorch.utils.data.sampler``: ``pad_index``, the index that a sampler yields for a
padding sample where it pads the last batch of an epoch.

Datasets written for cstorch check ``if i == pad_index`` in ``__getitem__`` and build a
padding sample. cerebrax's samplers never yield it: :class:`cerebrax.data.
DistributedSampler` pads a shard with real indices (cyclically), as torch's does, so
such a branch is never taken. The value is never a valid index of a dataset's
``range(len(dataset))``.
"""

from __future__ import annotations

from ...data import DistributedSampler as DistributedSampler

__all__ = ["DistributedSampler", "pad_index"]

#: The index a sampler yields for a padding sample (a batch filled past the data's end).
pad_index: int = -1
