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

__all__ = ["check_int", "is_array", "is_prng_key", "is_strict_int", "is_torch_module",
           "is_torch_tensor"]


def is_prng_key(x: Any) -> bool:
    """Whether ``x`` is an array of typed PRNG keys (``jax.random.key``), which numpy
    cannot hold and sharding cannot split: its ``jax.random.key_data`` can."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def is_torch_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (checked without importing torch)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def is_torch_module(x: Any) -> bool:
    """Whether ``x`` is a ``torch.nn.Module`` (checked without importing torch)."""
    return any(c.__module__.startswith("torch.nn") and c.__name__ == "Module"
               for c in type(x).__mro__)


def is_array(x: Any, *, torch: bool = False, like: bool = False) -> bool:
    """Whether ``x`` is an array: a JAX array (tracers included), numpy array or scalar.

    Python numbers and None are not arrays.

    Args:
      x: the value.
      torch: torch tensors count too.
      like: anything else with a ``shape`` and a ``dtype`` counts too
        (``jax.ShapeDtypeStruct``, lazy checkpoint arrays).
    """
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return True
    if torch and is_torch_tensor(x):
        return True
    return like and hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(
        x, (bool, int, float, complex))


def is_strict_int(x: Any) -> bool:
    """Whether ``x`` is a Python int and not a bool (``True`` is not a count)."""
    return isinstance(x, int) and not isinstance(x, bool)


def check_int(what: str, value: Any, *, ge: int | None = None, gt: int | None = None,
              optional: bool = False, error: type[Exception] = ConfigError) -> int | None:
    """``value`` as an int, or ``error``: "{what} must be an integer >= ge, got value.".

    Args:
      what: the argument as the user wrote it, e.g. ``"DataExecutor(num_steps=...)"``.
      value: the value to check (a bool is refused: ``True`` is not a count).
      ge, gt: the bound, if any (``ge=1`` reads ">= 1", ``gt=0`` reads "> 0").
      optional: whether None is allowed (and returned).
      error: the exception class to raise.
    """
    if value is None and optional:
        return None
    low_ok = (ge is None or (is_strict_int(value) and value >= ge)) and (
        gt is None or (is_strict_int(value) and value > gt))
    if not is_strict_int(value) or not low_ok:
        relation = f" >= {ge}" if ge is not None else f" > {gt}" if gt is not None else ""
        raise error(f"{what} must be an integer{relation}, got {value!r}.")
    return int(value)
