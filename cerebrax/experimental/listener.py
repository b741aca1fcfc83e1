"""``cstorch.experimental.listener``: hooks on the tensors of the traced graph; an error
in cerebrax (see :mod:`cerebrax.experimental`)."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedOpError

__all__ = ["register_traced_tensor_hook"]


def register_traced_tensor_hook(hook: Any) -> Any:
    """Calls ``hook`` on every tensor of the traced graph: an error in cerebrax."""
    raise UnsupportedOpError(
        "cstorch.experimental.listener.register_traced_tensor_hook is not supported by "
        "cerebrax: there are no per-tensor hooks in its compiled step. Read values in a "
        "step closure (@cstorch.step_closure) or with cstorch.summarize_tensor instead.")
