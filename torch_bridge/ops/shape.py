"""Views and layout: view, permute, expand, cat, slice, select, pad, flip, ..."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import _custom  # noqa: F401  (defines torch.ops.torch_bridge.stop_gradient)
from ._registry import lowering
from ._util import axes, axis, maybe_cast, shape_of

aten = torch.ops.aten


@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.view_copy.default)
def view(x, size):
    return jnp.reshape(x, shape_of(size))


@lowering(aten.alias.default, aten.lift_fresh_copy.default, aten.alias_copy.default)
def alias(x):
    return x


@lowering(aten.clone.default)
def clone(x, *, memory_format=None):
    return x


@lowering(aten.detach.default, torch.ops.torch_bridge.stop_gradient.default)
def detach(x):
    return lax.stop_gradient(x)


@lowering(aten._to_copy.default)
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None,
            non_blocking=False, memory_format=None):
    return maybe_cast(x, dtype)


@lowering(aten.copy.default)
def copy(x, src, non_blocking=False):
    return jnp.broadcast_to(jnp.asarray(src).astype(x.dtype), x.shape)


@lowering(aten.permute.default, aten.permute_copy.default)
def permute(x, dims):
    return jnp.transpose(x, tuple(axis(d, x.ndim) for d in dims))


@lowering(aten.t.default)
def t(x):
    return x.T


@lowering(aten.transpose.int)
def transpose(x, dim0, dim1):
    return jnp.swapaxes(x, axis(dim0, x.ndim), axis(dim1, x.ndim))


@lowering(aten.expand.default, aten.expand_copy.default)
def expand(x, size, *, implicit=False):
    size = shape_of(size)
    lead = len(size) - x.ndim
    shape = tuple(
        x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)
    )
    return jnp.broadcast_to(x, shape)


@lowering(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@lowering(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
          aten.squeeze_copy.dims)
def squeeze(x, dim=None):
    if isinstance(dim, (list, tuple)) and not dim:  # squeeze.dims with no dims: a no-op
        return x
    ax = axes(dim, x.ndim)
    return jnp.squeeze(x, tuple(a for a in ax if x.shape[a] == 1))


@lowering(aten.select.int, aten.select_copy.int)
def select(x, dim, index):
    a = axis(dim, x.ndim)
    return lax.index_in_dim(x, index % x.shape[a], axis=a, keepdims=False)


def _slice_bounds(size: int, start, end, step) -> tuple[int, int, int]:
    return slice(start, end, step).indices(size)


@lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(x, dim=0, start=None, end=None, step=1):
    a = axis(dim, x.ndim)
    lo, hi, st = _slice_bounds(x.shape[a], start, end, step)
    hi = max(hi, lo)
    return lax.slice_in_dim(x, lo, hi, st, axis=a)


@lowering(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    a = axis(dim, x.ndim)
    idx = (slice(None),) * a + (slice(*_slice_bounds(x.shape[a], start, end, step)),)
    return x.at[idx].set(src.astype(x.dtype))


@lowering(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    a = axis(dim, x.ndim)
    return x.at[(slice(None),) * a + (index,)].set(src.astype(x.dtype))


@lowering(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, axis(dim1, x.ndim), axis(dim2, x.ndim))


@lowering(aten.cat.default)
def cat(tensors, dim=0):
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return tensors[0]
    dtype = jnp.result_type(*kept)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=axis(dim, kept[0].ndim))


@lowering(aten.stack.default)
def stack(tensors, dim=0):
    return jnp.stack(tensors, axis=dim % (tensors[0].ndim + 1))


@lowering(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(x, split_sizes, dim=0):
    # One lax.split rather than a slice per piece: its derivative is one concatenate,
    # where each slice's would pad its cotangent to x's full shape.
    return list(lax.split(x, [int(s) for s in split_sizes], axis=axis(dim, x.ndim)))


@lowering(aten.split.Tensor, aten.split_copy.Tensor)
def split(x, split_size, dim=0):
    size = x.shape[axis(dim, x.ndim)]
    sizes = [split_size] * (size // split_size)
    if size % split_size:
        sizes.append(size % split_size)
    return split_with_sizes(x, sizes or [0], dim)


@lowering(aten.unbind.int, aten.unbind_copy.int)
def unbind(x, dim=0):
    a = axis(dim, x.ndim)
    return [lax.index_in_dim(x, i, axis=a, keepdims=False) for i in range(x.shape[a])]


@lowering(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, axis=tuple(axis(d, x.ndim) for d in dims)) if dims else x


@lowering(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(axis(d, x.ndim) for d in dims))


@lowering(aten.repeat.default)
def repeat(x, repeats):
    repeats = shape_of(repeats)
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, repeats)


@lowering(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowering(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


def _pad_config(ndim: int, pad) -> list[tuple[int, int]]:
    """torch's flat pad list (last dim first, (low, high) pairs) as per-axis pairs."""
    pairs = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        pairs[ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return pairs


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    config = [(lo, hi, 0) for lo, hi in _pad_config(x.ndim, pad)]
    return lax.pad(x, jnp.asarray(value, x.dtype), config)


def _pad_mode(mode: str):
    def fn(x, padding):
        return jnp.pad(x, _pad_config(x.ndim, padding), mode=mode)
    return fn


lowering(aten.reflection_pad1d.default, aten.reflection_pad2d.default,
         aten.reflection_pad3d.default)(_pad_mode("reflect"))
lowering(aten.replication_pad1d.default, aten.replication_pad2d.default,
         aten.replication_pad3d.default)(_pad_mode("edge"))


@lowering(aten.sym_size.int)
def sym_size(x, dim):
    return x.shape[dim]


@lowering(aten.sym_numel.default)
def sym_numel(x):
    return int(np.prod(x.shape))


@lowering(aten.sym_stride.int)
def sym_stride(x, dim):
    return int(np.prod(x.shape[axis(dim, x.ndim) + 1:]))


@lowering(aten.sym_storage_offset.default)
def sym_storage_offset(x):
    return 0


@lowering(aten._assert_tensor_metadata.default, aten._assert_scalar.default,
          aten.sym_constrain_range_for_size.default, aten._assert_async.msg,
          aten._assert_async.default)
def assert_noop(*args, **kwargs):
    return None


@lowering(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(x, size, stride, storage_offset=None):
    """A strided view of ``x``'s elements in row-major order (as a contiguous tensor)."""
    size, stride = shape_of(size), shape_of(stride)
    index = np.full(size, storage_offset or 0, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        index = index + (np.arange(n) * s).reshape(shape)
    return jnp.take(x.reshape(-1), jnp.asarray(index, jnp.int32))


@lowering(aten.view_as_real.default)
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lowering(aten.view_as_complex.default)
def view_as_complex(x):
    return jax.lax.complex(x[..., 0], x[..., 1])
