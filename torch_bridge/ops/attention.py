"""Scaled dot-product attention, kept whole by the export.

Where the graph is lowered for an NVIDIA GPU (:func:`lowering_platform`), attention that
cuDNN's fused kernel computes (half precision, no dropout, no mask but a causal one, a
head size it takes; an exported graph's boolean mask that depends on no input and is the
causal one counts as the causal flag, ``torch_bridge._program``) is
``jax.nn.dot_product_attention(..., implementation="cudnn")``: the
kernel that hand-written JAX uses there, with the T x T scores never in memory. Everything else,
and every graph lowered for a CPU, keeps cerebrax's own lowering, whose float32 scores
and softmax follow torch's CPU kernels.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch

from ._registry import lowering
from ._util import lowering_platform, platform

__all__ = ["fused_attention", "fused_attention_fits", "lowering_platform",
           "scaled_dot_product_attention"]

aten = torch.ops.aten


def _sdpa_is_random(q, k, v, attn_mask=None, dropout_p=0.0, *args, **kwargs):
    return dropout_p > 0


def _masked_scores(q, k, scale, mask, is_causal):
    """``scale * q @ k^T`` with the mask applied, in float32.

    Scores and the softmax over them are float32 at any input precision, and the scale
    multiplies the float32 scores, as torch's CPU kernels compute them for bfloat16 and
    float16: scaling ``q`` in bfloat16 first put the bridge 4x further from the float64
    result than torch (measured on the OpInfo samples)."""
    scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), preferred_element_type=jnp.float32)
    scores = scores * jnp.float32(scale)
    if is_causal:
        allowed = jnp.tril(jnp.ones(scores.shape[-2:], jnp.bool_))
        scores = jnp.where(allowed, scores, -jnp.inf)
    if mask is not None:
        scores = jnp.where(mask, scores, -jnp.inf)
    return scores


def _softmax(scores, empty):
    """The softmax of each row of scores; rows in ``empty`` (a mask left them no key) are
    zeros, as torch computes them, with zero gradients (None: no row is). The NaN of a
    row of -inf scores is kept out of the softmax itself: its backward would carry it."""
    if empty is None:
        return jax.nn.softmax(scores, axis=-1)
    weights = jax.nn.softmax(jnp.where(empty, jnp.zeros((), scores.dtype), scores), axis=-1)
    return jnp.where(empty, jnp.zeros((), weights.dtype), weights)


def _empty_rows(mask, scores):
    """Where a boolean ``mask`` leaves a row of ``scores`` no key (keepdims), or None where
    there is no mask (the causal flag alone leaves every row its first key)."""
    if mask is None:
        return None
    return ~jnp.any(jnp.broadcast_to(mask, scores.shape[:-2] + mask.shape[-2:]), axis=-1,
                    keepdims=True)


def _matmul(a, b, dtype):
    """``a @ b`` accumulated in float32, returned in ``dtype``; a float32 operand stays
    float32 (torch multiplies the float32 attention weights with the upcast values)."""
    common = jnp.promote_types(a.dtype, b.dtype)
    return jnp.matmul(a.astype(common), b.astype(common),
                      preferred_element_type=jnp.float32).astype(dtype)


# Attention without dropout and with no mask or a boolean one, with a hand-derived
# backward (the one flash attention uses): with P = softmax(S), O = P V,
#   dV = P^T dO,  dS = P * (dO V^T - rowsum(dO * O)),  dQ = scale * dS K,  dK = scale * dS^T Q.
# Against JAX's automatic derivative it drops a pass over the masked scores and the
# softmax's T x T row sums; a GPT training step on CPU ran ~3% faster (measured).
@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention_core(q, k, v, mask, scale: float, is_causal: bool):
    return _attention_core_fwd(q, k, v, mask, scale, is_causal)[0]


def _attention_core_fwd(q, k, v, mask, scale, is_causal):
    scores = _masked_scores(q, k, scale, mask, is_causal)
    if mask is not None and is_causal:
        mask = mask & jnp.tril(jnp.ones(scores.shape[-2:], jnp.bool_))
    weights = _softmax(scores, _empty_rows(mask, scores))
    out = _matmul(weights, v, v.dtype)
    # The backward keeps the weights at the values' precision (half the residual memory
    # of float32 ones in half-precision training).
    return out, (q, k, v, mask, weights.astype(v.dtype), out)


def _attention_core_bwd(scale, is_causal, residuals, dout):
    q, k, v, mask, weights, out = residuals
    dv = _matmul(jnp.swapaxes(weights, -1, -2), dout, v.dtype)
    dweights = jnp.matmul(dout, jnp.swapaxes(v, -1, -2), preferred_element_type=jnp.float32)
    rows = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1,
                   keepdims=True)
    dscores = (weights.astype(jnp.float32) * (dweights - rows) * jnp.float32(scale))
    dq = _matmul(dscores, k, q.dtype)
    dk = _matmul(jnp.swapaxes(dscores, -1, -2), q, k.dtype)
    return (_unbroadcast(dq, q.shape), _unbroadcast(dk, k.shape), _unbroadcast(dv, v.shape),
            None)


def _unbroadcast(grad, shape):
    """Sums ``grad`` down to ``shape`` (keys and values broadcast over leading dims)."""
    if grad.shape == tuple(shape):
        return grad
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, n in enumerate(shape) if n == 1 and grad.shape[i + lead] != 1)
    return jnp.sum(grad, axis=axes).reshape(shape)


_attention_core.defvjp(_attention_core_fwd, _attention_core_bwd)


# Head sizes cuDNN's fused attention takes (multiples of 8 up to 128).
_CUDNN_HEAD_SIZES = range(8, 129, 8)


def _is_cuda(platform: str) -> bool:
    """Whether ``platform`` is an NVIDIA GPU (JAX names CUDA and ROCm GPUs alike "gpu";
    its client's platform version tells them apart)."""
    if platform != "gpu":
        return platform == "cuda"
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError:  # no GPU backend in this process
        return False
    return "cuda" in str(getattr(device.client, "platform_version", "")).lower()


def fused_attention_fits(q, k, v, attn_mask, dropout_p, platform: str | None) -> bool:
    """Whether cuDNN's fused attention computes this call: on an NVIDIA GPU, query, key
    and value of one half-precision dtype in torch's ``(batch, heads, tokens, head
    size)``, key heads dividing query heads, a head size of 8 to 128 in steps of 8, no
    dropout and no mask (a causal one is a flag, not a mask)."""
    return (_is_cuda(platform or jax.default_backend()) and attn_mask is None
            and dropout_p == 0
            and q.ndim == k.ndim == v.ndim == 4
            and q.dtype == k.dtype == v.dtype and q.dtype in (jnp.bfloat16, jnp.float16)
            and q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[-1] in _CUDNN_HEAD_SIZES
            and k.shape[-3] == v.shape[-3] and q.shape[-3] % k.shape[-3] == 0)


def fused_attention(q, k, v, is_causal: bool, scale: float,
                    implementation: str = "cudnn") -> jax.Array:
    """``jax.nn.dot_product_attention`` on torch's layout (heads before tokens); key
    heads that divide the query heads are grouped as ``enable_gqa`` groups them."""
    def tokens_first(x):
        return jnp.swapaxes(x, -3, -2)

    out = jax.nn.dot_product_attention(
        tokens_first(q), tokens_first(k), tokens_first(v), scale=scale,
        is_causal=is_causal, implementation=implementation)
    return tokens_first(out)


def _attention(key, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    if (enable_gqa or k.shape[-3] == q.shape[-3]) and fused_attention_fits(
            q, k, v, attn_mask, dropout_p, platform()):
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        return fused_attention(q, k, v, bool(is_causal), float(scale))
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, rep, axis=-3), jnp.repeat(v, rep, axis=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if dropout_p == 0 and (attn_mask is None or attn_mask.dtype == jnp.bool_):
        return _attention_core(q, k, v, attn_mask, float(scale), bool(is_causal))
    scores = _masked_scores(q, k, scale, None, is_causal)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            scores = jnp.where(attn_mask, scores, -jnp.inf)
        else:
            scores = scores + attn_mask.astype(scores.dtype)
    empty = None
    if attn_mask is not None:  # a float mask's -inf too can empty a row
        empty = jnp.all(scores == -jnp.inf, axis=-1, keepdims=True)
    weights = _softmax(scores, empty)
    if dropout_p > 0:
        keep = jax.random.bernoulli(key, 1.0 - dropout_p, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_p), jnp.zeros((), weights.dtype))
    return _matmul(weights, v, v.dtype)


@lowering(aten.scaled_dot_product_attention.default, random=_sdpa_is_random)
def scaled_dot_product_attention(key, q, k, v, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, *, scale=None, enable_gqa=False):
    return _attention(key, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default)
def sdpa_flash_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    out = _attention(None, q, k, v, attn_mask, 0.0, is_causal, scale, False)
    return out, jnp.zeros(q.shape[:-1], jnp.float32)
