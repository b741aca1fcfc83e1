"""Scaled dot-product attention, kept whole by the export."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from .._registry import lowering

aten = torch.ops.aten


def _sdpa_is_random(q, k, v, attn_mask=None, dropout_p=0.0, *args, **kwargs):
    return dropout_p > 0


def _attention(key, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, rep, axis=-3), jnp.repeat(v, rep, axis=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = jnp.matmul(q * jnp.asarray(scale, q.dtype), jnp.swapaxes(k, -1, -2))
    length, source = q.shape[-2], k.shape[-2]
    if is_causal:
        allowed = jnp.tril(jnp.ones((length, source), jnp.bool_))
        scores = jnp.where(allowed, scores, -jnp.inf)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            scores = jnp.where(attn_mask, scores, -jnp.inf)
        else:
            scores = scores + attn_mask
    weights = jax.nn.softmax(scores, axis=-1)
    if dropout_p > 0:
        keep = jax.random.bernoulli(key, 1.0 - dropout_p, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_p), jnp.zeros((), weights.dtype))
    return jnp.matmul(weights, v)


@lowering(aten.scaled_dot_product_attention.default, random=_sdpa_is_random)
def scaled_dot_product_attention(key, q, k, v, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, *, scale=None, enable_gqa=False):
    return _attention(key, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default)
def sdpa_flash_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    out = _attention(None, q, k, v, attn_mask, 0.0, is_causal, scale, False)
    return out, jnp.zeros(q.shape[:-1], jnp.float32)
