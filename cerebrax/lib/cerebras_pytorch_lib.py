"""``cstorch.lib.cerebras_pytorch_lib``: ``set_attribute``, which attaches a compiler
attribute to a tensor. cerebrax has no wafer compiler: the attribute is checked and
recorded (:func:`recorded_attributes`), and the tensor is unchanged."""

from __future__ import annotations

from typing import Any, NamedTuple

from .._runtime import RUNTIME
from ..errors import ConfigError

__all__ = ["TensorAttribute", "recorded_attributes", "set_attribute"]


class TensorAttribute(NamedTuple):
    """One ``set_attribute`` call: the tensor's shape, the attribute's name and value."""

    shape: tuple
    name: str
    value: Any


def set_attribute(tensor: Any, name: str, value: Any) -> None:
    """Attaches compiler attribute ``name`` = ``value`` to ``tensor`` (recorded only)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"set_attribute(tensor, name, value): name must be a non-empty "
                          f"string, got {name!r}.")
    shape = tuple(getattr(tensor, "shape", ()))
    RUNTIME.tensor_attributes.append(TensorAttribute(shape, name, value))


def recorded_attributes() -> list[TensorAttribute]:
    """Every attribute set in this process so far, oldest first."""
    return list(RUNTIME.tensor_attributes)
