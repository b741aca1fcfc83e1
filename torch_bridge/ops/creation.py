"""Tensor factories: full, zeros, arange, scalar_tensor, *_like."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from ._dtypes import jax_dtype
from ._registry import lowering
from ._util import shape_of

aten = torch.ops.aten


def _dtype_for(value, dtype):
    if dtype is not None:
        return jax_dtype(dtype)
    if isinstance(value, bool):
        return jnp.bool_
    if isinstance(value, int):
        return jax_dtype(torch.int64)
    return jax_dtype(torch.get_default_dtype())


@lowering(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(shape_of(size), fill_value, dtype=_dtype_for(fill_value, dtype))


@lowering(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(shape_of(size), dtype=_dtype_for(0.0, dtype))


@lowering(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(shape_of(size), dtype=_dtype_for(1.0, dtype))


@lowering(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None,
          memory_format=None):
    return jnp.zeros(shape_of(size), dtype=_dtype_for(0.0, dtype))


@lowering(aten.empty_permuted.default)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None,
                   pin_memory=None):
    """``torch.empty_permuted``: the memory order ``physical_layout`` has no meaning for
    a JAX array, so this is ``empty`` (zeros) of the logical ``size``."""
    return jnp.zeros(shape_of(size), dtype=_dtype_for(0.0, dtype))


@lowering(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(shape_of(size), dtype=_dtype_for(0.0, dtype))


def _like_dtype(x, dtype):
    return x.dtype if dtype is None else jax_dtype(dtype)


@lowering(aten.full_like.default)
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    return jnp.full(x.shape, fill_value, dtype=_like_dtype(x, dtype))


@lowering(aten.zeros_like.default, aten.empty_like.default)
def zeros_like(x, *, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    return jnp.zeros(x.shape, dtype=_like_dtype(x, dtype))


@lowering(aten.ones_like.default)
def ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    return jnp.ones(x.shape, dtype=_like_dtype(x, dtype))


@lowering(aten.new_full.default)
def new_full(x, size, fill_value, *, dtype=None, layout=None, device=None,
             pin_memory=None):
    return jnp.full(shape_of(size), fill_value, dtype=_like_dtype(x, dtype))


@lowering(aten.new_zeros.default, aten.new_empty.default)
def new_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(shape_of(size), dtype=_like_dtype(x, dtype))


@lowering(aten.new_ones.default)
def new_ones(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(shape_of(size), dtype=_like_dtype(x, dtype))


@lowering(aten.new_empty_strided.default)
def new_empty_strided(x, size, stride, *, dtype=None, layout=None, device=None,
                      pin_memory=None):
    return jnp.zeros(shape_of(size), dtype=_like_dtype(x, dtype))


@lowering(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    return jnp.full(x.shape, value, dtype=x.dtype)


@lowering(aten.scalar_tensor.default)
def scalar_tensor(value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(value, dtype=jax_dtype(dtype or torch.get_default_dtype()))


@lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def arange(start, end=None, step=1, *, dtype=None, layout=None, device=None,
           pin_memory=None):
    if end is None:
        start, end = 0, start
    values = (start, end, step)
    if dtype is None:
        integral = all(isinstance(v, int) for v in values)
        dtype = torch.int64 if integral else torch.get_default_dtype()
    n = max(int(np.ceil((end - start) / step)), 0)
    return (start + step * jnp.arange(n)).astype(jax_dtype(dtype))


@lowering(aten.linspace.default)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.linspace(start, end, steps).astype(_dtype_for(0.0, dtype))


@lowering(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=_dtype_for(0.0, dtype))
