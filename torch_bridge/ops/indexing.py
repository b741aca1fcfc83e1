"""Indexing: index, index_put, gather, scatter, embedding, index_select."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from cerebrax.errors import UnsupportedOpError

from ._registry import lowering
from ._util import axis

aten = torch.ops.aten


def _index_tuple(indices) -> tuple:
    return tuple(slice(None) if i is None else i for i in indices)


@lowering(aten.index.Tensor)
def index(x, indices):
    if any(i is not None and i.dtype == jnp.bool_ for i in indices):
        raise UnsupportedOpError(
            "aten.index.Tensor with a boolean mask has a data-dependent shape, which a "
            "static JAX graph cannot express. Use torch.where(mask, x, other) instead."
        )
    return x[_index_tuple(indices)]


@lowering(aten.index_put.default, aten._unsafe_index_put.default)
def index_put(x, indices, values, accumulate=False):
    values = values.astype(x.dtype)
    masks = [i for i in indices if i is not None and i.dtype == jnp.bool_]
    if masks:
        if len(indices) != 1 or values.size != 1:
            raise UnsupportedOpError(
                "aten.index_put with a boolean mask is supported for `x[mask] = scalar` "
                "only (a mask over leading dims and one value); use torch.where instead."
            )
        mask = indices[0].reshape(indices[0].shape + (1,) * (x.ndim - indices[0].ndim))
        v = values.reshape(())
        return jnp.where(mask, x + v if accumulate else v, x)
    idx = _index_tuple(indices)
    return x.at[idx].add(values) if accumulate else x.at[idx].set(values)


@lowering(aten._unsafe_index.Tensor)
def unsafe_index(x, indices):
    return x[_index_tuple(indices)]


@lowering(aten.index_select.default)
def index_select(x, dim, index):
    if x.ndim == 0:  # torch: a 0-d input and a one-element index give the input
        return x
    return jnp.take(x, index, axis=axis(dim, x.ndim), mode="clip")


@lowering(aten.index_add.default)
def index_add(x, dim, index, source, alpha=1):
    a = axis(dim, x.ndim)
    idx = (slice(None),) * a + (index,)
    return x.at[idx].add((alpha * source).astype(x.dtype))


@lowering(aten.index_copy.default)
def index_copy(x, dim, index, source):
    a = axis(dim, x.ndim)
    return x.at[(slice(None),) * a + (index,)].set(source.astype(x.dtype))


@lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(x, dim, index, value):
    a = axis(dim, x.ndim)
    return x.at[(slice(None),) * a + (index,)].set(jnp.asarray(value, x.dtype))


def _crop_to(x, shape, skip: int):
    """``x`` cut down to ``shape`` in every axis but ``skip`` (torch lets gather /
    scatter indices be smaller than the tensor there)."""
    if all(x.shape[d] == shape[d] for d in range(x.ndim) if d != skip):
        return x
    limits = [x.shape[d] if d == skip else shape[d] for d in range(x.ndim)]
    return lax.slice(x, (0,) * x.ndim, limits)


@lowering(aten.gather.default)
def gather(x, dim, index, *, sparse_grad=False):
    if x.ndim == 0:
        return x.reshape(index.shape)
    if index.size == 0:  # torch accepts any empty index, whatever its rank
        return jnp.zeros(index.shape, x.dtype)
    a = axis(dim, x.ndim)
    x = _crop_to(x, index.shape, a)
    if index.shape[a] == 1:
        return _gather_one(x, index, a)
    return jnp.take_along_axis(x, index, axis=a, mode="promise_in_bounds")


# One element picked per line (nll_loss's decomposition picks the target's
# log-probability so): the gradient is a select against the index, which fuses with
# what consumes it, where JAX's own is a scatter-add into a zeroed copy of ``x``. The
# same values (one addend per element); on a GPT-2 step over a 50257-word vocabulary
# the zeroed copy alone took 2.5% of the step on an H200.
@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gather_one(x, index, a: int):
    return jnp.take_along_axis(x, index, axis=a, mode="promise_in_bounds")


def _gather_one_fwd(x, index, a):
    # ``x`` itself is not kept: an empty array holds its dtype and its size along ``a``
    return _gather_one(x, index, a), (index, jnp.zeros((0, x.shape[a]), x.dtype))


def _gather_one_bwd(a, residuals, grad):
    index, like = residuals
    shape = index.shape[:a] + (like.shape[1],) + index.shape[a + 1:]
    hit = lax.broadcasted_iota(index.dtype, shape, a) == index
    return jnp.where(hit, grad, jnp.zeros((), like.dtype)), None


_gather_one.defvjp(_gather_one_fwd, _gather_one_bwd)


def _scatter_index(index, a: int) -> tuple:
    grids = jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij", sparse=True)
    return tuple(index if d == a else grids[d] for d in range(index.ndim))


def _scatter(x, dim, index, src, reduce: str | None, include_self: bool = True):
    if x.ndim == 0:
        x, index = x.reshape(1), index.reshape(1)
        src = jnp.asarray(src).reshape(1) if jnp.ndim(src) else src
        return _scatter(x, 0, index, src, reduce, include_self).reshape(())
    a = axis(dim, x.ndim)
    if jnp.ndim(src):
        src = _crop_to(src, index.shape, -1)
    src = jnp.broadcast_to(jnp.asarray(src, x.dtype), index.shape)
    idx = _scatter_index(index, a)
    ref = x.at[idx]
    if reduce in (None, "none"):
        return ref.set(src)
    if reduce in ("sum", "add"):
        base = x if include_self else x.at[idx].set(0)
        return base.at[idx].add(src)
    if reduce in ("prod", "multiply"):
        base = x if include_self else x.at[idx].set(1)
        return base.at[idx].multiply(src)
    if reduce in ("amax", "amin"):
        info = jnp.iinfo(x.dtype) if jnp.issubdtype(x.dtype, jnp.integer) else jnp.finfo(x.dtype)
        fill = info.min if reduce == "amax" else info.max
        base = x if include_self else x.at[idx].set(fill)
        return base.at[idx].max(src) if reduce == "amax" else base.at[idx].min(src)
    if reduce == "mean":
        base = x if include_self else x.at[idx].set(0)
        total = base.at[idx].add(src)
        count = jnp.ones_like(x) if include_self else jnp.zeros_like(x)
        count = count.at[idx].add(jnp.ones_like(src))
        out = total / jnp.maximum(count, 1)
        return out.astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.integer) else out
    raise UnsupportedOpError(f"scatter with reduce={reduce!r} has no lowering.")


@lowering(aten.scatter.src, aten.scatter.value)
def scatter(x, dim, index, src):
    return _scatter(x, dim, index, src, None)


@lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    return _scatter(x, dim, index, src, reduce)


@lowering(aten.scatter_add.default)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "sum")


@lowering(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    return _scatter(x, dim, index, src, reduce, include_self)


@lowering(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        raise UnsupportedOpError(
            "aten.embedding with scale_grad_by_freq=True has no lowering "
            "(nn.Embedding(..., scale_grad_by_freq=False) is supported)."
        )
    out = weight[indices]
    if padding_idx is not None and padding_idx >= 0:
        # torch gives the padding row no gradient.
        pad = (indices == padding_idx)[..., None]
        out = jnp.where(pad, lax.stop_gradient(out), out)
    return out


@lowering(aten.embedding_renorm.default)
def embedding_renorm(weight, indices, max_norm, norm_type):
    """``nn.Embedding(max_norm=...)``: every row that ``indices`` names and whose
    ``norm_type``-norm exceeds ``max_norm`` is scaled by ``max_norm / (norm + 1e-7)``
    (torch's kernel); the other rows are kept. The gradient passes through as if the
    renormalized rows were the weight itself (torch renormalizes in place under no_grad,
    then differentiates the lookup with respect to the weight)."""
    weight_in = lax.stop_gradient(weight)
    used = jnp.zeros((weight.shape[0],), jnp.bool_).at[jnp.ravel(indices)].set(True)
    w32 = weight_in.astype(jnp.float32)
    if norm_type == float("inf"):
        norms = jnp.max(jnp.abs(w32), axis=1)
    else:
        norms = jnp.sum(jnp.abs(w32) ** norm_type, axis=1) ** (1.0 / norm_type)
    scale = jnp.where(used & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    renormed = (w32 * scale[:, None]).astype(weight.dtype)
    return weight + lax.stop_gradient(renormed - weight)


@lowering(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)  # torch broadcasts both
    x, mask = jnp.broadcast_to(x, shape), jnp.broadcast_to(mask, shape)
    flat_mask = mask.reshape(-1)
    positions = jnp.cumsum(flat_mask) - 1
    picked = jnp.take(source.reshape(-1), jnp.clip(positions, 0, source.size - 1))
    return jnp.where(flat_mask, picked, x.reshape(-1)).reshape(x.shape)


@lowering(aten._embedding_bag.default)
def embedding_bag(*args, **kwargs):
    return _embedding_bag(*args, **kwargs, sizes_per_offset=False)


@lowering(aten._embedding_bag_forward_only.default)
def embedding_bag_forward_only(*args, **kwargs):
    return _embedding_bag(*args, **kwargs, sizes_per_offset=True)


def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1, *,
                   sizes_per_offset: bool):
    """Bags of embeddings reduced by sum (mode 0), mean (1) or max (2).

    Returns torch's four outputs in the shapes of torch's CPU meta kernel (what the
    exported graph records): the bags; each index's bag (empty in sum mode on float32 or
    float16 rows without padding_idx); the bag sizes (zeros in sum mode), one per bag, or
    with ``sizes_per_offset`` (the forward-only op) one per offset; and the row that gave
    each maximum in max mode, zeros of the bags' count otherwise.
    """
    if scale_grad_by_freq:
        raise UnsupportedOpError("embedding_bag with scale_grad_by_freq=True has no lowering.")
    n = indices.shape[0]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    seg = jnp.clip(jnp.searchsorted(offsets, jnp.arange(n), side="right") - 1, 0, bags - 1)
    padded = padding_idx is not None and padding_idx >= 0
    valid = indices != padding_idx if padded else jnp.ones((n,), jnp.bool_)
    rows = weight[indices]
    # Sums and weights apply in float32 at bfloat16 and float16, as in torch's CPU kernel.
    acc = jnp.float32 if rows.dtype in (jnp.bfloat16, jnp.float16) else rows.dtype
    if per_sample_weights is not None:  # sum mode only (torch checks)
        rows = rows.astype(acc) * per_sample_weights[:, None].astype(acc)
    counts = jax.ops.segment_sum(valid.astype(jnp.int32), seg, bags)
    sizes = jnp.pad(counts, (0, offsets.shape[0] - bags)) if sizes_per_offset else counts
    if mode == 0:
        out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0).astype(acc), seg,
                                  bags).astype(weight.dtype)
        fast = not padded and weight.dtype in (jnp.float32, jnp.float16)
        return (out, jnp.zeros((0,), jnp.int32) if fast else seg, jnp.zeros_like(sizes),
                jnp.zeros((bags,), jnp.int32))
    if mode == 1:
        total = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0).astype(acc), seg, bags)
        out = (total / jnp.maximum(counts, 1)[:, None].astype(acc)).astype(weight.dtype)
        return out, seg, sizes, counts
    lowest = jnp.asarray(-jnp.inf, rows.dtype)
    best = jax.ops.segment_max(jnp.where(valid[:, None], rows, lowest), seg, bags)
    empty = (counts == 0)[:, None]
    out = jnp.where(empty, jnp.zeros((), rows.dtype), best)
    is_best = valid[:, None] & (rows == lax.stop_gradient(best)[seg])
    first = jax.ops.segment_min(jnp.where(is_best, jnp.arange(n)[:, None], n), seg, bags)
    max_indices = jnp.where(empty, 0, indices[jnp.clip(first, 0, n - 1)])
    return out, seg, sizes, max_indices
