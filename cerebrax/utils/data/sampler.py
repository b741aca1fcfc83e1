"""``cstorch.utils.data.sampler``: ``pad_index``, the index that a sampler yields for a
padding sample where it pads the last batch of an epoch.

Datasets written for cstorch check ``if i == pad_index`` in ``__getitem__`` and build a
padding sample. :class:`cerebrax.data.DistributedSampler` yields it only with
``pad_last=True``, to fill the last partial batch; otherwise it pads a shard with real
indices (cyclically), as torch's does. The value is never a valid index of a dataset's
``range(len(dataset))``.
"""

from __future__ import annotations

from ...data import DistributedSampler as DistributedSampler
from ...data import pad_index as pad_index

__all__ = ["DistributedSampler", "pad_index"]
