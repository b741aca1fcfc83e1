"""Small helpers shared by the lowerings."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._dtypes import jax_dtype

__all__ = ["axes", "axis", "broadcast_accumulating", "is_half", "lowering_platform",
           "kept", "maybe_cast", "platform", "rounded_product", "safe_sqrt", "shape_of",
           "torch_release", "widened"]

_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def is_half(x: Any) -> bool:
    """Whether ``x`` is an array of float16 or bfloat16."""
    return hasattr(x, "dtype") and jnp.dtype(x.dtype) in _HALF


# The platform the graph being lowered will run on (None: JAX's default backend). The
# caller that builds the program knows it; the lowering cannot see it in the arrays.
_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "torch_bridge_lowering_platform", default=None)


@contextlib.contextmanager
def lowering_platform(platform: str | None) -> Iterator[None]:
    """Lowers the graphs traced inside the block for ``platform`` (a JAX platform name,
    ``"cpu"`` or ``"gpu"``, or ``"cuda"``; None: JAX's default backend), which decides
    the attention kernel, and on a CPU how half-precision products are kept rounded."""
    token = _PLATFORM.set(platform)
    try:
        yield
    finally:
        _PLATFORM.reset(token)


def platform() -> str:
    """The platform the graph being lowered will run on (see :func:`lowering_platform`)."""
    return _PLATFORM.get() or jax.default_backend()


def rounded_product(x: Any, y: Any) -> Any:
    """``x * y``, rounded before any sum that consumes it, as torch eager rounds every
    operation: for float16 and bfloat16 results on a CPU, where XLA lets LLVM fuse a
    product and the addition that uses it into one FMA instruction, which a CPU with
    half-precision arithmetic (AVX-512 FP16) then rounds once (``kept``). The lowerings
    compute their gradients' products with it too (``_scalar_ops``)."""
    return kept(x * y)


def kept(x: Any) -> Any:
    """``x``, which XLA may not fold into the operation that consumes it: on a CPU, for
    float16 and bfloat16, behind an optimization barrier. XLA's algebraic simplifier
    rewrites ``a / b / c`` as ``a / (b * c)`` and ``a / sqrt(b)`` as ``a * rsqrt(b)``,
    which round otherwise than torch eager's operation by operation (22724 of 65536
    float16 elements of ``(x / y) / x`` differed). Elsewhere ``x`` itself."""
    if not is_half(x) or platform() != "cpu":
        return x
    return jax.lax.optimization_barrier(x)


def widened(x: Any) -> Any:
    """``x`` in float32, for a computation torch does in float32: a half ``x`` rounded
    to its dtype first on a CPU (``kept``), where XLA would otherwise hand on the float32
    value of the bfloat16 operation that made it (798 of 4096 elements of ``(x + y) *
    0.1`` differed from torch)."""
    return kept(x).astype(jnp.float32)


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
    """``x`` as the JAX dtype standing for torch ``dtype`` (unchanged when None). A half
    ``x`` widened to float32 or float64 is rounded to its half dtype first (``kept``):
    on a CPU, XLA computes a bfloat16 operation in float32 and would hand that float32
    value on to the cast unrounded (35252 of 65536 elements of ``(x + y).float()``
    differed from torch eager)."""
    if dtype is None:
        return x
    target = jnp.dtype(jax_dtype(dtype))
    x = jnp.asarray(x)
    if is_half(x) and jnp.issubdtype(target, jnp.floating) and target.itemsize > 2:
        x = kept(x)
    return x.astype(target)


def shape_of(size: Sequence[Any]) -> tuple[int, ...]:
    return tuple(int(s) for s in size)


def safe_sqrt(s: Any) -> Any:
    """sqrt with torch's gradient at 0 (zero, where plain sqrt gives NaN): norms and
    distances of zero vectors). A NaN stays NaN, as torch's norm of a NaN vector."""
    zero = s == 0
    return jnp.where(zero, 0.0, jnp.sqrt(jnp.where(zero, 1.0, s))).astype(s.dtype)
