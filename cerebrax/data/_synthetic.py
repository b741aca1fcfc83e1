"""``SyntheticDataset``: samples shaped like a spec, to run a model without real data.

This module imports torch: ``cerebrax.utils.data.SyntheticDataset`` loads it on first use.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from .._filters import check_int
from ..errors import ConfigError

__all__ = ["SyntheticDataset"]


def _is_leaf(x: Any) -> bool:
    return isinstance(x, (torch.Tensor, np.ndarray)) or callable(x)


class SyntheticDataset(torch.utils.data.IterableDataset):
    """An iterable dataset whose samples are built from ``sample_spec``.

    Batch it with a torch ``DataLoader(dataset, batch_size=...)`` in an ``input_fn``;
    a compile-only or validate-only run, or a throughput test, then needs no dataset.

    Args:
      sample_spec: a nested structure (lists, tuples, dicts, named tuples) whose leaves
        are torch tensors or numpy arrays, copied into every sample (a constant sample),
        or callables ``f(index) -> tensor`` called with the sample's index (e.g. random
        samples: ``lambda i: torch.randn(3, generator=torch.Generator().manual_seed(i))``).
      num_samples: the number of samples, or None for samples without end (such a
        dataset has no ``len``: give the DataLoader a number of steps).

    Example:
      >>> from cerebrax.utils.data import SyntheticDataset
      >>> spec = {"x": torch.zeros(3), "y": lambda i: torch.tensor(i)}
      >>> [sample["y"].item() for sample in SyntheticDataset(spec, num_samples=3)]
      [0, 1, 2]
      >>> loader = torch.utils.data.DataLoader(SyntheticDataset(spec, num_samples=4), batch_size=2)
      >>> batch = next(iter(loader))
      >>> batch["x"].shape, batch["y"]
      (torch.Size([2, 3]), tensor([0, 1]))
    """

    def __init__(self, sample_spec: Any, num_samples: int | None = None):
        super().__init__()
        leaves, self._spec = pytree.tree_flatten(sample_spec, is_leaf=_is_leaf)
        if not leaves:
            raise ConfigError(
                "SyntheticDataset(sample_spec=...) holds no tensor: give a tensor, or a "
                "list, tuple or dict of tensors (or of callables index -> tensor)."
            )
        for leaf in leaves:
            if not _is_leaf(leaf):
                raise ConfigError(
                    f"SyntheticDataset(sample_spec=...) leaves must be torch tensors, numpy "
                    f"arrays or callables index -> tensor, got {type(leaf).__name__} "
                    f"({leaf!r}). Wrap numbers: torch.tensor(value)."
                )
        self._leaves: list[Any] = leaves
        self.num_samples = check_int("SyntheticDataset(num_samples=...)", num_samples,
                                     gt=0, optional=True)

    def sample(self, index: int) -> Any:
        """Sample ``index``: copies of the constant leaves, the callables' results."""
        return pytree.tree_unflatten([self._make(leaf, index) for leaf in self._leaves],
                                     self._spec)

    @staticmethod
    def _make(leaf: Any, index: int) -> Any:
        if isinstance(leaf, torch.Tensor):
            return leaf.clone()
        if isinstance(leaf, np.ndarray):
            return torch.from_numpy(leaf.copy())
        return leaf(index)

    def __iter__(self) -> Iterator[Any]:
        index = 0
        while self.num_samples is None or index < self.num_samples:
            yield self.sample(index)
            index += 1

    def __len__(self) -> int:
        if self.num_samples is None:
            raise TypeError(
                "This SyntheticDataset has no length: it was built with num_samples=None "
                "(samples without end). Pass num_samples, or give the DataLoader num_steps."
            )
        return self.num_samples

