"""ATen's backward kernels: the gradients of convolution, pooling, embedding and the
normalizations, as they appear in exported training graphs.

Each is the vector-Jacobian product of the matching forward lowering (``jax.vjp``), so
a backward kernel and its forward op agree by construction; the embedding and max-pool
backwards are scatter-adds of the gradient to the positions the forward read.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from . import conv, pool
from ._registry import lowering

aten = torch.ops.aten


def _vjp(fn, grad, *primals):
    """The cotangents of ``fn``'s inputs for the output cotangent ``grad``."""
    out, pullback = jax.vjp(fn, *primals)
    return pullback(grad.astype(out.dtype))


@lowering(aten.convolution_backward.default)
def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    def forward(x, w):
        return conv.convolution(x, w, None, stride, padding, dilation, transposed,
                                output_padding, groups)

    dx, dw = _vjp(forward, grad, x, w)
    db = jnp.sum(grad, axis=(0, *range(2, grad.ndim))) if output_mask[2] else None
    return (dx if output_mask[0] else None, dw if output_mask[1] else None, db)


@lowering(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    def forward(x):
        return pool.avg_pool2d(x, kernel_size, stride, padding, ceil_mode,
                               count_include_pad, divisor_override)

    return _vjp(forward, grad, x)[0]


@lowering(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad, x):
    return _vjp(lambda x: pool.adaptive_avg_pool2d(x, grad.shape[-2:]), grad, x)[0]


@lowering(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    """Adds each output's gradient at the input position ``indices`` names (flat over
    the input's H*W, as the forward returned them)."""
    lead = x.shape[:-2]
    flat_grad = grad.reshape(-1, grad.shape[-2] * grad.shape[-1])
    flat_idx = indices.reshape(flat_grad.shape)
    rows = jnp.arange(flat_grad.shape[0])[:, None]
    out = jnp.zeros((flat_grad.shape[0], x.shape[-2] * x.shape[-1]), grad.dtype)
    return out.at[rows, flat_idx].add(flat_grad).reshape(*lead, *x.shape[-2:])


@lowering(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """Sums the gradient rows of every lookup into the rows they read; the padding row
    gets none; ``scale_grad_by_freq`` divides each row by how often it was read."""
    flat = indices.reshape(-1)
    rows = grad.reshape(flat.shape[0], -1)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), jnp.int32).at[flat].add(1)
        rows = rows / counts[flat][:, None].astype(rows.dtype)
    keep = (flat != padding_idx)[:, None]
    out = jnp.zeros((num_weights, rows.shape[1]), grad.dtype)
    return out.at[flat].add(jnp.where(keep, rows, 0).astype(grad.dtype))


def _masked(grads, output_mask):
    return tuple(g if keep else None for g, keep in zip(grads, output_mask))


def _norm_dx(dy, xhat, rstd, weight, axes):
    """The input gradient of ``xhat * weight + bias`` with ``xhat`` normalized over
    ``axes``: ``rstd * (g - mean(g) - xhat * mean(g * xhat))``, ``g = dy * weight``."""
    g = dy if weight is None else dy * weight
    return rstd * (g - jnp.mean(g, axis=axes, keepdims=True)
                   - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True))


@lowering(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias,
                               output_mask):
    """Uses the forward's saved ``mean`` and ``rstd`` (so its epsilon)."""
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    batch = tuple(range(x.ndim - len(normalized_shape)))
    xhat = (x - mean) * rstd
    dx = _norm_dx(grad, xhat, rstd, weight, axes).astype(x.dtype)
    dw = None if weight is None else jnp.sum(grad * xhat, axis=batch).astype(weight.dtype)
    db = None if bias is None else jnp.sum(grad, axis=batch).astype(bias.dtype)
    return _masked((dx, dw, db), output_mask)


@lowering(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad, x, mean, rstd, weight, n, c, hw, group, output_mask):
    """Uses the forward's saved per-group ``mean`` and ``rstd`` of shape (N, group)."""
    shape = (n, group, c // group, hw)
    dy = grad.reshape(shape)
    xhat = (x.reshape(shape) - mean.reshape(n, group, 1, 1)) * rstd.reshape(n, group, 1, 1)
    w = None if weight is None else weight.reshape(1, group, c // group, 1)
    dx = _norm_dx(dy, xhat, rstd.reshape(n, group, 1, 1), w, (2, 3))
    dw = jnp.sum(dy * xhat, axis=(0, 3)).reshape(c)
    db = jnp.sum(dy, axis=(0, 3)).reshape(c)
    return _masked((dx.reshape(x.shape).astype(x.dtype), dw, db), output_mask)
