"""Small predicates and argument checks, each defined once and used everywhere.

Which values are arrays, which are torch objects (tested without importing torch), and
the strict integer check that every public argument goes through. Nothing here imports
another cerebrax module except :mod:`cerebrax.errors`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .errors import ConfigError

__all__ = ["check_int", "is_array", "is_strict_int", "is_torch_module", "is_torch_tensor"]


def is_torch_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (checked without importing torch)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def is_torch_module(x: Any) -> bool:
    """Whether ``x`` is a ``torch.nn.Module`` (checked without importing torch)."""
    return any(c.__module__.startswith("torch.nn") and c.__name__ == "Module"
               for c in type(x).__mro__)


def is_array(x: Any, *, torch: bool = False) -> bool:
    """Whether ``x`` is an array: a JAX array (tracers included), numpy array or scalar.

    Python numbers and None are not arrays. With ``torch=True`` torch tensors count too.
    """
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return True
    return torch and is_torch_tensor(x)


def is_strict_int(x: Any) -> bool:
    """Whether ``x`` is a Python or numpy integer and not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_int(name: str, value: Any, minimum: int | None = None, *, optional: bool = False,
              where: str = "", error: type[Exception] = ConfigError) -> int | None:
    """``value`` as an int, or ``error`` naming ``name``, the value and the range.

    Args:
      name: the argument's name, as the user wrote it.
      value: the value to check (a bool is refused: ``True`` is not a count).
      minimum: the smallest value allowed, if any.
      optional: whether None is allowed (and returned).
      where: the call the argument belongs to, e.g. ``"DataExecutor"``.
      error: the exception class to raise.
    """
    if value is None and optional:
        return None
    if not is_strict_int(value) or (minimum is not None and value < minimum):
        wanted = "an integer" if minimum is None else f"an integer >= {minimum}"
        prefix = f"{where}: " if where else ""
        raise error(f"{prefix}{name} must be {wanted}, got {value!r}.")
    return int(value)
