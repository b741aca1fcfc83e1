"""``cstorch.utils.kernel``: ``kernel_annotater``, which asks the wafer's compiler for a
named kernel for the operations of a call. Recorded, run unchanged (see
:mod:`cerebrax.core.annotation`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..core.annotation import AnnotationMode, create_annotation

__all__ = ["kernel_annotater"]


@dataclasses.dataclass
class _KernelConfig(AnnotationMode.Config):
    kernel: Any


def _attribute(config: _KernelConfig, is_backward: bool) -> AnnotationMode.Attribute:
    return AnnotationMode.Attribute("kernel", config.kernel)


def kernel_annotater(kernel: Any) -> Callable[[Callable], Callable]:
    """``kernel_annotater(name)(fn)``: ``fn`` run unchanged, annotated with the kernel
    ``name`` (None: no kernel asked for)."""
    return create_annotation(_KernelConfig, _attribute, kernel=kernel, enable_bwd=False)
