"""The precision policy: which dtype a compiled model computes in.

On the CSX backend cerebrax follows the wafer: weights stay float32 and the model's
forward and backward run in float16 (mixed precision is on by default). On CPU and
GPU the model computes in float32 unless :func:`set_half_dtype` chose a half dtype.
``set_half_dtype("float32")`` turns mixed precision off on every backend, which is
how the emulated wafer is compared with a float32 single-device run.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._runtime import RUNTIME
from .backend import current_backend
from .errors import ConfigError

__all__ = ["compute_dtype", "get_half_dtype", "get_half_dtype_str", "mixed_precision",
           "set_half_dtype"]

_HALF_DTYPES = {"float16": jnp.float16, "bfloat16": jnp.bfloat16, "float32": jnp.float32,
                "cbfloat16": jnp.float16}


def set_half_dtype(dtype: Any) -> Any:
    """Chooses the compute dtype of mixed precision and returns it.

    Args:
      dtype: ``"float16"`` (the wafer's default), ``"bfloat16"``, ``"float32"``
        (mixed precision off), ``"cbfloat16"`` (float16 proxy), or the matching
        numpy / JAX / torch dtype.

    Example:
      >>> import cerebrax as cstorch
      >>> cstorch.amp.set_half_dtype("bfloat16")
      dtype(bfloat16)
    """
    name = _dtype_name(dtype)
    if name not in _HALF_DTYPES:
        raise ConfigError(
            f"set_half_dtype() expects one of {sorted(_HALF_DTYPES)}, got {dtype!r}."
        )
    RUNTIME.half_dtype = name
    return jnp.dtype(_HALF_DTYPES[name])


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str):
        return dtype.lower().removeprefix("torch.")
    text = str(dtype)
    if text.startswith("torch."):
        return text.removeprefix("torch.")
    try:
        return jnp.dtype(dtype).name
    except TypeError:
        return text


def get_half_dtype() -> Any:
    """The chosen half dtype (float16 when none was chosen)."""
    return jnp.dtype(_HALF_DTYPES[get_half_dtype_str()])


def get_half_dtype_str() -> str:
    return RUNTIME.half_dtype or "float16"


def mixed_precision(backend: Any = None) -> bool:
    """Whether models compute in a half dtype on ``backend`` (the current one if None)."""
    return compute_dtype(backend) is not None


def compute_dtype(backend: Any = None) -> Any | None:
    """The dtype models compute in, or None for float32 (no casts)."""
    if backend is None:
        backend = current_backend(raise_exception=False)
    if RUNTIME.half_dtype is not None:
        name = RUNTIME.half_dtype
    elif backend is not None and backend.is_csx:
        name = "float16"
    else:
        return None
    dtype = _HALF_DTYPES[name]
    return None if dtype == jnp.float32 else jnp.dtype(dtype)


def cast_floating(tree: Any, dtype: Any) -> Any:
    """Casts the floating-point leaves of ``tree`` to ``dtype``."""
    return jax.tree.map(
        lambda x: x.astype(dtype)
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)
        else x,
        tree,
    )

