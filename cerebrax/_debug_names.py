"""``add_debug_name`` / ``get_debug_name``: a module's dotted name in its model, for
messages and summaries that name the module a value comes from."""

from __future__ import annotations

from typing import Any

from ._filters import is_torch_module
from ._runtime import RUNTIME
from .errors import ConfigError

__all__ = ["add_debug_name", "get_debug_name"]


def add_debug_name(module: Any, root_name: str | None = None) -> None:
    """Names every submodule of ``module`` by its path in it (``"encoder.layers.0"``);
    ``module`` itself is ``root_name`` (default: its class name in lower case).

    Example:
      >>> import torch, cerebrax as cstorch
      >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
      >>> cstorch.add_debug_name(model)
      >>> cstorch.get_debug_name(model[0])
      'sequential.0'
    """
    if not is_torch_module(module):
        raise ConfigError(f"add_debug_name(module): expected a torch.nn.Module, got "
                          f"{type(module).__name__}.")
    root = root_name or type(module).__name__.lower()
    for name, sub in module.named_modules():
        RUNTIME.debug_names[sub] = f"{root}.{name}" if name else root


def get_debug_name(module: Any) -> str:
    """The name :func:`add_debug_name` gave ``module`` (its class name in lower case if
    it has none)."""
    return RUNTIME.debug_names.get(module, type(module).__name__.lower())
