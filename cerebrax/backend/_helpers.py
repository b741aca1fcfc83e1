"""cstorch's top-level tensor helpers: ``full``/``ones``/``zeros`` (and ``_like``),
``from_numpy`` / ``to_numpy``, ``make_constant`` and ``name_scope``.

cstorch builds these as lazily materialized tensors of its device. cerebrax keeps
state in JAX, so they are plain values, following "like in, like out": a ``_like``
helper given a torch tensor returns a torch tensor, given a JAX array (a compiled
parameter, a value in a traced step) or a numpy array returns a JAX array; the shape
helpers return torch tensors, as cstorch's do, unless a JAX or numpy dtype asks for a
JAX array (or torch is not installed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._filters import is_torch_tensor
from .._step import to_numpy as _array_of
from .._step import to_torch
from ..errors import ConfigError

__all__ = ["from_numpy", "full", "full_like", "make_constant", "name_scope", "ones",
           "ones_like", "to_numpy", "zeros", "zeros_like"]


def _is_torch_dtype(dtype: Any) -> bool:
    return type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype"


def _torch() -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


def full(shape: int | Sequence[int], value: float, dtype: Any = None) -> Any:
    """A tensor of ``shape`` filled with ``value``: a torch tensor (``torch.full``), or a
    JAX array when ``dtype`` is a numpy / JAX dtype or name (or torch is missing).

    Example:
      >>> cstorch.full((2, 3), 0.5)                        # a torch tensor
      tensor([[0.5000, 0.5000, 0.5000],
              [0.5000, 0.5000, 0.5000]])
      >>> cstorch.full(3, 7, dtype=jnp.int32)              # a JAX dtype: a JAX array
      Array([7, 7, 7], dtype=int32)
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    torch = _torch()
    if torch is not None and (dtype is None or _is_torch_dtype(dtype)):
        return torch.full(shape, value, dtype=dtype)
    if _is_torch_dtype(dtype):
        raise ConfigError(f"full(dtype={dtype}) asks for a torch tensor, but torch is missing.")
    return jnp.full(shape, value, dtype=dtype)


def ones(shape: int | Sequence[int], dtype: Any = None) -> Any:
    """:func:`full` of ones."""
    return full(shape, 1, dtype=dtype if dtype is not None else _default_float())


def zeros(shape: int | Sequence[int], dtype: Any = None) -> Any:
    """:func:`full` of zeros."""
    return full(shape, 0, dtype=dtype if dtype is not None else _default_float())


def _default_float() -> Any:
    torch = _torch()
    return torch.get_default_dtype() if torch is not None else jnp.float32


def full_like(other: Any, value: float, dtype: Any = None) -> Any:
    """A tensor shaped like ``other`` filled with ``value``, of ``other``'s kind (torch
    tensor, or JAX array for a JAX / numpy array or a compiled parameter) and, unless
    ``dtype`` is given, its dtype."""
    if is_torch_tensor(other) and not hasattr(other, "__jax_array__"):
        torch = _torch()
        return torch.full(tuple(other.shape), value, dtype=dtype or other.dtype)
    if is_torch_tensor(other):  # a torch tensor of a traced step: torch's own op
        return _torch().full_like(other, value, dtype=dtype)
    like = getattr(other, "value", other)  # a compiled Parameter holds its array
    return jnp.full(jnp.shape(like), value, dtype=dtype or jnp.result_type(like))


def ones_like(other: Any, dtype: Any = None) -> Any:
    """:func:`full_like` of ones."""
    return full_like(other, 1, dtype=dtype)


def zeros_like(other: Any, dtype: Any = None) -> Any:
    """:func:`full_like` of zeros."""
    return full_like(other, 0, dtype=dtype)


def from_numpy(array: np.ndarray) -> Any:
    """A torch tensor over ``array``'s memory (a copy if ``array`` is read-only), with
    ``ml_dtypes.bfloat16`` arrays as ``torch.bfloat16``."""
    array = np.asarray(array)
    if not array.flags.writeable:
        array = array.copy()
    return to_torch(array, copy=False)


def to_numpy(tensor: Any) -> np.ndarray:
    """A numpy array of a torch tensor (a view for a CPU tensor; bfloat16 as
    ``ml_dtypes.bfloat16``), a JAX array (a host copy) or a numpy array."""
    return _array_of(tensor)


def make_constant(tensor: Any) -> Any:
    """``tensor`` as a constant of the traced step's graph.

    A value known before the step runs (a torch or numpy array, a JAX array outside a
    traced step) is already compiled into the graph as a constant when the step uses it,
    so XLA can fold it; this returns it as such: a torch tensor stays a (detached) torch
    tensor, anything else becomes a JAX array.

    Raises:
      ConfigError: ``tensor`` is a traced value (computed by the step itself).
    """
    step_tensor = is_torch_tensor(tensor) and hasattr(tensor, "__jax_array__")
    inner = tensor.__jax_array__() if step_tensor else tensor
    if isinstance(inner, jax.core.Tracer):
        raise ConfigError(
            "make_constant() got a value the traced step computes, which is not known "
            "when the graph is built. Pass a value known before the step runs (a tensor "
            "or array built from Python or numpy values)."
        )
    if is_torch_tensor(tensor):
        return tensor.detach()
    return jnp.asarray(tensor)


def name_scope(name: str) -> Any:
    """Names the operations traced under it (a context manager or decorator).

    The name prefixes the operations' names in the compiled program
    (``jax.named_scope``), where XLA's dumps and profiles show it, e.g.
    ``with cstorch.name_scope("attention"): ...``.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name_scope() expects a non-empty string, got {name!r}.")
    return jax.named_scope(name)
