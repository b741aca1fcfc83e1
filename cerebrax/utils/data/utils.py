"""``cstorch.utils.data.utils``: ``infer_batch_size`` and the ``Schedule`` of steps."""

from __future__ import annotations

from typing import Any

import jax

from ..._filters import is_array
from ...data import Schedule as Schedule
from ...errors import ConfigError

__all__ = ["Schedule", "infer_batch_size"]


def infer_batch_size(data: Any, batch_size: int | None = None) -> int | None:
    """The batch size of a nested batch: the size of the first dimension that all its
    arrays (torch tensors, numpy or JAX arrays) share; None when it holds none with a
    dimension. ``batch_size``: the size expected so far (checked against).

    Raises:
      ConfigError: two arrays disagree on the batch size (both named).

    Example:
      >>> import numpy as np
      >>> from cerebrax.utils.data.utils import infer_batch_size
      >>> infer_batch_size({"x": np.zeros((4, 3)), "y": [np.zeros(4)], "n": 7})
      4
    """
    found: tuple[str, int] | None = None
    if batch_size is not None:
        found = ("the given batch_size", batch_size)
    for path, value in jax.tree_util.tree_flatten_with_path(data)[0]:
        if not is_array(value, torch=True) or not tuple(value.shape):
            continue
        shape, where = tuple(value.shape), jax.tree_util.keystr(path) or "the batch"
        if found is not None and shape[0] != found[1]:
            raise ConfigError(
                f"The batch's arrays disagree on the batch size: "
                f"{found[0]} has {found[1]}, {where} has {shape[0]}. Every array of a "
                "batch has the batch as its first dimension.")
        found = found or (where, shape[0])
    return None if found is None else found[1]
