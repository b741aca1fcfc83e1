"""``cstorch.backend.ltc_backend``: hooks of cstorch's lazy-tensor backend.

cstorch calls a hook registered with ``register_after_tensor_to_cpu`` on every tensor its
device sends to the host (Model Zoo's throughput profiler times batches with it). cerebrax
has no lazy-tensor transfer: the registration is accepted, so that such code runs, and the
hook is never called. Nothing of training changes. A step closure
(``@cstorch.step_closure``) receives the step's values on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["InertHandle", "register_after_tensor_to_cpu"]


class InertHandle:
    """The handle of a hook cerebrax accepts and never calls: ``remove()`` does nothing."""

    def __init__(self, hook: Callable[..., Any]):
        self.hook = hook

    def remove(self) -> None:
        """Unregisters the hook (it was never called)."""

    def __enter__(self) -> InertHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def register_after_tensor_to_cpu(hook: Callable[[Any, str], Any]) -> InertHandle:
    """Registers ``hook(tensor, name)`` for the tensors moved to the host; cerebrax never
    calls it (see the module docstring). Returns a handle with ``remove()``."""
    return InertHandle(hook)
