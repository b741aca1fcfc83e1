"""Normalization: layer norm (hand-written backward), batch norm, group norm."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ._registry import lowering
from ._util import broadcast_accumulating

aten = torch.ops.aten


# ---- layer norm ----------------------------------------------------------------------
# JAX's automatic derivative of layer norm made a whole GPT training step ~1.6x slower on
# CPU (measured); the hand-derived backward below gives identical numerics:
#   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * weight.
@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm(x, weight, bias, axes: tuple[int, ...], eps: float):
    return _layer_norm_fwd(x, weight, bias, axes, eps)[0]


def _stats(x, axes, eps):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = jnp.mean(centered * centered, axis=axes, keepdims=True)
    return mean, centered, lax.rsqrt(var + eps)


def _layer_norm_fwd(x, weight, bias, axes, eps):
    _, centered, rstd = _stats(x, axes, eps)
    xhat = centered * rstd
    # An empty array carries the bias dtype: under mixed precision x, weight and bias
    # may differ in dtype, and each gradient must come back in its input's dtype.
    return xhat * weight + bias, (xhat, rstd, weight, jnp.zeros((0,), bias.dtype))


def _layer_norm_bwd(axes, eps, residuals, dy):
    xhat, rstd, weight, bias_like = residuals
    batch = tuple(range(xhat.ndim - len(axes)))
    g = dy * weight
    dx = rstd * (g - jnp.mean(g, axis=axes, keepdims=True)
                 - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True))
    return (dx.astype(xhat.dtype), jnp.sum(dy * xhat, axis=batch).astype(weight.dtype),
            jnp.sum(dy, axis=batch).astype(bias_like.dtype))


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


@lowering(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean, _, rstd = _stats(lax.stop_gradient(x), axes, eps)
    shape = tuple(x.shape[a] for a in axes)
    w = jnp.ones(shape, x.dtype) if weight is None else weight
    b = jnp.zeros(shape, x.dtype) if bias is None else bias
    return _layer_norm(x, w, b, axes, float(eps)), mean, rstd


# ---- batch norm ----------------------------------------------------------------------
def _bn_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _affine(xhat, weight, bias):
    if weight is not None:
        xhat = xhat * broadcast_accumulating(weight.reshape(_bn_shape(xhat)), xhat.shape)
    if bias is not None:
        xhat = xhat + broadcast_accumulating(bias.reshape(_bn_shape(xhat)), xhat.shape)
    return xhat


def _batch_stats(x, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    mean = jnp.mean(x, axis=axes)
    centered = x - mean.reshape(_bn_shape(x))
    var = jnp.mean(centered * centered, axis=axes)
    rstd = lax.rsqrt(var + eps)
    return mean, var, centered * rstd.reshape(_bn_shape(x)), rstd


def _running_update(mean, var, running_mean, running_var, momentum, n):
    """torch's update: momentum-weighted, with the unbiased batch variance."""
    mean, var = lax.stop_gradient(mean), lax.stop_gradient(var)
    unbiased = var * (n / max(n - 1, 1))
    new_mean = (1 - momentum) * running_mean + momentum * mean.astype(running_mean.dtype)
    new_var = (1 - momentum) * running_var + momentum * unbiased.astype(running_var.dtype)
    return new_mean, new_var


def _count(x) -> int:
    return x.size // x.shape[1]


@lowering(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum,
                          eps):
    if not training:
        out, mean, rstd = batch_norm_no_training(x, weight, bias, running_mean, running_var,
                                                 momentum, eps)
        return out, mean, rstd, running_mean, running_var
    mean, var, xhat, rstd = _batch_stats(x, eps)
    new_mean, new_var = _running_update(mean, var, running_mean, running_var, momentum,
                                        _count(x))
    return _affine(xhat, weight, bias), mean, rstd, new_mean, new_var


@lowering(aten._native_batch_norm_legit.default, aten.native_batch_norm.default)
def batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    out, mean, rstd, *_ = batch_norm_functional(
        x, weight, bias, running_mean, running_var, training, momentum, eps)
    return out, mean, rstd


@lowering(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    mean, _, xhat, rstd = _batch_stats(x, eps)
    return _affine(xhat, weight, bias), mean, rstd


@lowering(aten._native_batch_norm_legit_no_training.default)
def batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    rstd = lax.rsqrt(running_var + eps)
    xhat = (x - running_mean.reshape(_bn_shape(x))) * rstd.reshape(_bn_shape(x))
    empty = jnp.zeros((0,), x.dtype)
    return _affine(xhat, weight, bias), empty, empty


# ---- group norm ----------------------------------------------------------------------
@lowering(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, n, c, hw, group, eps):
    grouped = x.reshape(n, group, (c // group) * hw)
    mean = jnp.mean(grouped, axis=-1, keepdims=True)
    centered = grouped - mean
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = _affine((centered * rstd).reshape(x.shape), weight, bias)
    return out, mean.reshape(n, group), rstd.reshape(n, group)
