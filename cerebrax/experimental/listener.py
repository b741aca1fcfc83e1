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

from ..backend.ltc_backend import InertHandle

__all__ = ["register_traced_tensor_hook"]


def register_traced_tensor_hook(hook: Callable[[Any, str], Any]) -> InertHandle:
    """Registers ``hook(tensor, name)`` for the tensors of the traced graph; cerebrax never
    calls it (see the module docstring). Returns a handle with ``remove()``."""
    return InertHandle(hook)
