"""Random ops. Each receives its own ``jax.random`` key (split per graph node)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from ._dtypes import jax_dtype
from ._registry import lowering
from ._util import shape_of

aten = torch.ops.aten


def _dropout_is_random(x, p, train=None):
    return train is not False and p > 0


@lowering(aten.native_dropout.default, random=_dropout_is_random)
def native_dropout(key, x, p, train=None):
    if key is None:  # eval mode or p == 0
        return x, jnp.ones(x.shape, jnp.bool_)
    if p >= 1:
        return jnp.zeros_like(x), jnp.zeros(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    return jnp.where(keep, x * (1.0 / (1.0 - p)), jnp.zeros((), x.dtype)), keep


def _float_dtype(dtype):
    return jax_dtype(dtype or torch.get_default_dtype())


@lowering(aten.rand.default, random=True)
def rand(key, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.uniform(key, shape_of(size), _float_dtype(dtype))


@lowering(aten.randn.default, random=True)
def randn(key, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.normal(key, shape_of(size), _float_dtype(dtype))


@lowering(aten.rand_like.default, random=True)
def rand_like(key, x, *, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    return jax.random.uniform(key, x.shape, x.dtype if dtype is None else jax_dtype(dtype))


@lowering(aten.randn_like.default, random=True)
def randn_like(key, x, *, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    return jax.random.normal(key, x.shape, x.dtype if dtype is None else jax_dtype(dtype))


@lowering(aten.bernoulli.default, random=True)
def bernoulli(key, probs, *, generator=None):
    return jax.random.bernoulli(key, probs).astype(probs.dtype)


@lowering(aten.bernoulli.p, random=True)
def bernoulli_p(key, x, p=0.5, *, generator=None):
    return jax.random.bernoulli(key, p, x.shape).astype(x.dtype)


@lowering(aten.randint.default, random=True)
def randint(key, high, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return randint_low(key, 0, high, size, dtype=dtype)


@lowering(aten.randint.low, random=True)
def randint_low(key, low, high, size, *, dtype=None, layout=None, device=None,
                pin_memory=None):
    dtype = jax_dtype(dtype or torch.int64)
    return jax.random.randint(key, shape_of(size), low, high, dtype=jnp.int32).astype(dtype)


@lowering(aten.randint_like.default, aten.randint_like.low_dtype, random=True)
def randint_like(key, x, low, high=None, *, dtype=None, layout=None, device=None,
                 pin_memory=None, memory_format=None):
    if high is None:
        low, high = 0, low
    dtype = x.dtype if dtype is None else jax_dtype(dtype)
    return jax.random.randint(key, x.shape, low, high, dtype=jnp.int32).astype(dtype)


@lowering(aten.randperm.default, random=True)
def randperm(key, n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.permutation(key, n).astype(jax_dtype(dtype or torch.int64))


@lowering(aten.normal_functional.default, random=True)
def normal_functional(key, x, mean=0.0, std=1.0, *, generator=None):
    return mean + std * jax.random.normal(key, x.shape, x.dtype)


@lowering(aten.uniform.default, random=True)
def uniform(key, x, low=0.0, high=1.0, *, generator=None):
    return jax.random.uniform(key, x.shape, x.dtype, low, high)


@lowering(aten.multinomial.default, random=True)
def multinomial(key, probs, num_samples, replacement=False, *, generator=None):
    logits = jnp.log(probs)
    if replacement:
        shape = (num_samples,) + probs.shape[:-1]
        out = jax.random.categorical(key, logits, axis=-1, shape=shape)
        return jnp.moveaxis(out, 0, -1)
    gumbel = jax.random.gumbel(key, probs.shape, probs.dtype)
    return jax.lax.top_k(logits + gumbel, num_samples)[1]
