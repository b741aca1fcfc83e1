"""``cstorch.nn``: the torch modules cstorch ships (``SmoothL1Loss``), ``SelectiveGrad``,
and :mod:`.functional` (``one_hot``, the mixture-of-experts matmuls).

These are torch code that runs in torch eager and in traced steps alike. They load torch
on first use, so ``import cerebrax`` does not.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SelectiveGrad", "SmoothL1Loss", "functional"]


def __getattr__(name: str) -> Any:
    # import_module, not ``from . import``: that asks this __getattr__ again
    if name == "functional":
        return importlib.import_module(f"{__name__}.functional")
    if name in ("SmoothL1Loss", "SelectiveGrad"):
        return getattr(importlib.import_module(f"{__name__}._modules"), name)
    raise AttributeError(f"module 'cerebrax.nn' has no attribute {name!r}")
