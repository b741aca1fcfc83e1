"""``cstorch.utils.kernel``: ``kernel_annotater``, which asks the wafer's compiler for a
named kernel for the operations of a call. Recorded, run unchanged (see
:mod:`cerebrax.core.annotation`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.annotation import value_annotation

__all__ = ["kernel_annotater"]


def kernel_annotater(kernel: Any) -> Callable[[Callable], Callable]:
    """``kernel_annotater(name)(fn)``: ``fn`` run unchanged, annotated with the kernel
    ``name`` (None: no kernel asked for)."""
    return value_annotation("kernel", kernel, enable_bwd=False)
