"""Attention rows that a mask leaves without a single key: torch gives them zeros.

torch's attention (its CPU kernels, and its math path since 2.5) computes a row whose
every key is masked out as zeros, with zero gradients; a plain softmax over a row of
-inf scores is 0/0, NaN, which also poisons the gradient of every key through the
backward's sums. The bridge's lowering must give torch's zeros, with its float32 numbers
everywhere else.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import torch_bridge  # noqa: E402


class Masked(torch.nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


def _masks():
    keep = torch.ones(6, 6, dtype=torch.bool).tril(-1)  # row 0 keeps no key
    keep[3] = False  # nor does row 3
    additive = torch.zeros(6, 6).masked_fill(~keep, float("-inf"))
    per_batch = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    per_batch[0, :, 0] = False  # the first sequence's row 0, the second's row 4
    per_batch[1, :, 4] = False
    return {"bool": keep, "float": additive, "bool per batch": per_batch}


@pytest.mark.parametrize("case", list(_masks()))
def test_rows_with_no_key_are_zero_as_in_torch(case):
    mask = _masks()[case]
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8, requires_grad=True) for _ in range(3))
    module = Masked(mask)
    out = module(q, k, v)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    assert torch.isfinite(out).all() and (out[0, :, 0] == 0).all()  # torch's zeros

    converted = torch_bridge.convert(module, (q.detach(), k.detach(), v.detach()), train=True)

    def loss(q, k, v):
        y = converted.apply(converted.params, converted.buffers, q, k, v)[0]
        return jnp.sum(y * torch_bridge.to_jax(weights)), y

    args = tuple(torch_bridge.to_jax(t.detach()) for t in (q, k, v))
    (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*args)
    np.testing.assert_allclose(np.asarray(y), out.detach().numpy(), rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6)
