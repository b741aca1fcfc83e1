"""Small helpers shared by the lowerings."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._dtypes import jax_dtype

__all__ = ["axes", "axis", "broadcast_accumulating", "is_half", "maybe_cast", "safe_sqrt",
           "shape_of", "torch_release"]

_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def is_half(x: Any) -> bool:
    """Whether ``x`` is an array of float16 or bfloat16."""
    return hasattr(x, "dtype") and jnp.dtype(x.dtype) in _HALF


def torch_release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string (``"2.14.1+cu130"`` -> ``(2, 14)``)."""
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    return major, minor


def broadcast_accumulating(x: Any, shape: Sequence[int]) -> Any:
    """``x`` broadcast to ``shape``; for a float16 or bfloat16 ``x``, with a gradient
    summed in float32 and rounded once, as torch's backward sums a broadcast operand
    (a bias, a norm's weight) in its accumulation type. JAX's own transpose of a
    broadcast sums in the operand's dtype, which XLA on CPU accumulates in float16.

    Other dtypes, and an ``x`` of ``shape`` already, are returned unchanged.
    """
    shape = tuple(int(d) for d in shape)
    if not is_half(x) or tuple(x.shape) == shape:
        return x
    return _broadcast(x, shape, tuple(x.shape))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _broadcast(x, shape, x_shape):
    return jnp.broadcast_to(x, shape)


def _broadcast_fwd(x, shape, x_shape):
    return jnp.broadcast_to(x, shape), None


def _broadcast_bwd(shape, x_shape, _, g):
    lead = len(shape) - len(x_shape)
    summed = tuple(range(lead)) + tuple(
        lead + i for i, (a, b) in enumerate(zip(x_shape, shape[lead:])) if a == 1 and b != 1)
    total = jnp.sum(g.astype(jnp.float32), axis=summed)
    return (total.reshape(x_shape).astype(g.dtype),)


_broadcast.defvjp(_broadcast_fwd, _broadcast_bwd)


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
    distances of zero vectors). A NaN stays NaN, as torch's norm of a NaN vector."""
    zero = s == 0
    return jnp.where(zero, 0.0, jnp.sqrt(jnp.where(zero, 1.0, s))).astype(s.dtype)
