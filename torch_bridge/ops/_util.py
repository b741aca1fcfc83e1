"""Small helpers shared by the lowerings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from ._dtypes import jax_dtype

__all__ = ["axes", "axis", "maybe_cast", "safe_sqrt", "shape_of"]


def axis(d: int, ndim: int) -> int:
    """A torch dim (possibly negative) as a non-negative axis; 0-d tensors accept 0 / -1."""
    n = max(ndim, 1)
    return d % n


def axes(ds: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """torch dims as axes; None or an empty list means every axis (torch's convention)."""
    if ds is None:
        return tuple(range(ndim))
    if isinstance(ds, int):
        ds = [ds]
    if len(ds) == 0:
        return tuple(range(ndim))
    return tuple(sorted({axis(d, ndim) for d in ds})) if ndim else ()


def maybe_cast(x: Any, dtype: Any) -> Any:
    """``x`` as the JAX dtype standing for torch ``dtype`` (unchanged when None)."""
    if dtype is None:
        return x
    return jnp.asarray(x).astype(jax_dtype(dtype))


def shape_of(size: Sequence[Any]) -> tuple[int, ...]:
    return tuple(int(s) for s in size)


def safe_sqrt(s: Any) -> Any:
    """sqrt with torch's gradient at 0 (zero, where plain sqrt gives NaN): norms and
    distances of zero vectors."""
    positive = s > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, s, 1.0)), 0.0).astype(s.dtype)
