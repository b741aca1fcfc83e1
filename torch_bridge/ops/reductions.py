"""Reductions, scans, sorting."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ._registry import lowering
from ._util import axes, axis, maybe_cast, safe_sqrt

aten = torch.ops.aten


def _int_to_long(x):
    """torch sums bool/int tensors in int64 (int32 without JAX x64)."""
    if x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jax.dtypes.canonicalize_dtype(jnp.int64))
    return x


@lowering(aten.sum.dim_IntList, aten.sum.default)
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    x = maybe_cast(x, dtype) if dtype is not None else _int_to_long(x)
    return jnp.sum(x, axis=axes(dim, x.ndim), keepdims=keepdim)


@lowering(aten.mean.dim, aten.mean.default)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    x = maybe_cast(x, dtype)
    return jnp.mean(x, axis=axes(dim, x.ndim), keepdims=keepdim)


@lowering(aten.prod.default)
def prod(x, *, dtype=None):
    x = maybe_cast(x, dtype) if dtype is not None else _int_to_long(x)
    return jnp.prod(x)


@lowering(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, *, dtype=None):
    x = maybe_cast(x, dtype) if dtype is not None else _int_to_long(x)
    if x.ndim == 0:  # torch accepts dim 0 / -1 on a 0-d tensor
        return x
    return jnp.prod(x, axis=axis(dim, x.ndim), keepdims=keepdim)


@lowering(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=axes(dim, x.ndim), keepdims=keepdim)


@lowering(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=axes(dim, x.ndim), keepdims=keepdim)


@lowering(aten.max.default)
def max_(x):
    return jnp.max(x)


@lowering(aten.min.default)
def min_(x):
    return jnp.min(x)


@lowering(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    a = axis(dim, x.ndim)
    return jnp.max(x, axis=a, keepdims=keepdim), jnp.argmax(x, axis=a, keepdims=keepdim)


@lowering(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    a = axis(dim, x.ndim)
    return jnp.min(x, axis=a, keepdims=keepdim), jnp.argmin(x, axis=a, keepdims=keepdim)


@lowering(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    if dim is None:
        out = jnp.argmax(x.reshape(-1))
        return out.reshape((1,) * x.ndim) if keepdim else out
    if x.ndim == 0:
        return jnp.zeros((), jnp.int32)
    return jnp.argmax(x, axis=axis(dim, x.ndim), keepdims=keepdim)


@lowering(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    if dim is None:
        out = jnp.argmin(x.reshape(-1))
        return out.reshape((1,) * x.ndim) if keepdim else out
    if x.ndim == 0:
        return jnp.zeros((), jnp.int32)
    return jnp.argmin(x, axis=axis(dim, x.ndim), keepdims=keepdim)


@lowering(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x, dim=None, keepdim=False):
    return jnp.any(x, axis=axes(dim, x.ndim), keepdims=keepdim)


@lowering(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x, dim=None, keepdim=False):
    return jnp.all(x, axis=axes(dim, x.ndim), keepdims=keepdim)


def _correction(correction, unbiased=None):
    if correction is None:
        return 1 if unbiased is None or unbiased else 0
    return correction


@lowering(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return jnp.var(x, axis=axes(dim, x.ndim), ddof=_correction(correction), keepdims=keepdim)


@lowering(aten.var.dim)
def var_dim(x, dim=None, unbiased=True, keepdim=False):
    return jnp.var(x, axis=axes(dim, x.ndim), ddof=int(bool(unbiased)), keepdims=keepdim)


@lowering(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.std(x, axis=axes(dim, x.ndim), ddof=_correction(correction), keepdims=keepdim)


@lowering(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    ax = axes(dim, x.ndim)
    return (jnp.var(x, axis=ax, ddof=_correction(correction), keepdims=keepdim),
            jnp.mean(x, axis=ax, keepdims=keepdim))


@lowering(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    return jax.nn.logsumexp(x, axis=axes(dim, x.ndim), keepdims=keepdim)


@lowering(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    x = maybe_cast(x, dtype) if dtype is not None else _int_to_long(x)
    return x if x.ndim == 0 else jnp.cumsum(x, axis=axis(dim, x.ndim))


@lowering(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    x = maybe_cast(x, dtype) if dtype is not None else _int_to_long(x)
    return x if x.ndim == 0 else jnp.cumprod(x, axis=axis(dim, x.ndim))


@lowering(aten.sort.default, aten.sort.stable)
def sort(x, dim=-1, descending=False, *, stable=None):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    a = axis(dim, x.ndim)
    keys = -x if descending and not jnp.issubdtype(x.dtype, jnp.unsignedinteger) else x
    idx = jnp.argsort(keys, axis=a, stable=True)
    return jnp.take_along_axis(x, idx, axis=a), idx


@lowering(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    if x.ndim == 0:  # torch treats a 0-d tensor as one element along dim 0 or -1
        values, idx = topk(x.reshape(1), k, 0, largest, sorted)
        return values.reshape(()), idx.reshape(())
    a = axis(dim, x.ndim)
    moved = jnp.moveaxis(x, a, -1)
    values, idx = lax.top_k(moved if largest else -moved, k)
    if not largest:
        values = -values
    return jnp.moveaxis(values, -1, a), jnp.moveaxis(idx, -1, a)


@lowering(aten.linalg_vector_norm.default)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    x = maybe_cast(x, dtype)
    ax = axes(dim, x.ndim)
    a = jnp.abs(x)
    if ord == float("inf"):
        return jnp.max(a, axis=ax, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=ax, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(a != 0, axis=ax, keepdims=keepdim).astype(x.dtype)
    if ord == 1:
        return jnp.sum(a, axis=ax, keepdims=keepdim)
    if ord == 2:
        return safe_sqrt(jnp.sum(x * x, axis=ax, keepdims=keepdim))
    return jnp.sum(a ** ord, axis=ax, keepdims=keepdim) ** (1.0 / ord)


@lowering(aten.histc.default)
def histc(x, bins=100, min=0, max=0):  # noqa: A002
    """``torch.histc``: counts of ``x`` in ``bins`` equal-width bins over [min, max]
    (the data's range when min == max, widened by 1 each side when that is empty too).
    An element's bin is ``int((v - lo) * bins / (hi - lo))``, the right edge falling in
    the last bin, as torch computes it; elements outside the range count nowhere."""
    flat = x.reshape(-1)
    if min == max:
        lo, hi = (jnp.min(flat), jnp.max(flat)) if flat.size else (jnp.zeros((), x.dtype),) * 2
    else:
        lo, hi = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    pos = ((flat - lo) * bins / (hi - lo)).astype(jnp.int32)
    pos = jnp.where(pos == bins, bins - 1, pos)
    inside = (flat >= lo) & (flat <= hi)
    counts = jnp.zeros((bins,), x.dtype).at[jnp.where(inside, pos, bins)].add(
        jnp.ones_like(flat), mode="drop")
    return counts
