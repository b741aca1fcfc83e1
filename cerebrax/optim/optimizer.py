"""``cstorch.optim.optimizer``: the ``Optimizer`` base class and ``ParamsT``, the type of
what an optimizer takes as its parameters (as ``torch.optim.optimizer.ParamsT``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Union

from ._base import Optimizer as Optimizer

__all__ = ["Optimizer", "ParamsT"]

ParamsT = Union[Iterable[Any], Iterable[dict[str, Any]]]
"""Parameters (tensors), or parameter groups (dicts with a ``"params"`` entry)."""
