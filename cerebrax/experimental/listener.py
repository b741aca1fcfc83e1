"""``cstorch.experimental.listener``: hooks on the tensors of the traced graph.

cstorch calls a registered hook on every tensor its compiler traces (Model Zoo's listener
callbacks register one to dump tensor names or attach listeners to them). cerebrax's
compiled step has no per-tensor listeners: the registration is accepted, so that such code
runs, and the hook is never called. Nothing of training changes. Read values in a step
closure (``@cstorch.step_closure``) or with ``cstorch.summarize_tensor`` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["InertHandle", "register_traced_tensor_hook"]


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


def register_traced_tensor_hook(hook: Callable[[Any, str], Any]) -> InertHandle:
    """Registers ``hook(tensor, name)`` for the tensors of the traced graph; cerebrax never
    calls it (see the module docstring). Returns a handle with ``remove()``."""
    return InertHandle(hook)
