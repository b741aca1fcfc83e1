"""``cstorch.backend.ltc_backend``: hooks of cstorch's lazy-tensor backend.
``register_after_tensor_to_cpu`` (a hook on every tensor the device sends to the host)
is not available in cerebrax; calling it is an error that gives the alternative."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedOpError

__all__ = ["register_after_tensor_to_cpu"]


def register_after_tensor_to_cpu(hook: Any) -> Any:
    """A hook on every tensor moved to the host: an error in cerebrax."""
    raise UnsupportedOpError(
        "cstorch.backend.ltc_backend.register_after_tensor_to_cpu is not supported by "
        "cerebrax: it has no lazy-tensor transfer to hook. Read the values in a step "
        "closure (@cstorch.step_closure), which receives them on the host.")
