"""Which attention kernel a graph gets: cuDNN's fused one on a GPU where it fits, cerebrax's
own lowering everywhere else (every CPU graph keeps its numerics).

The GPU kernel itself needs a GPU; here the dispatch is checked, and the mapping of
torch's layout onto ``jax.nn.dot_product_attention`` is checked with JAX's XLA
implementation of the same function against torch.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cerebrax as cstorch  # noqa: E402
import torch_bridge  # noqa: E402
from torch_bridge.ops import attention  # noqa: E402


def qkv(dtype=jnp.bfloat16, heads=(4, 4), head_size=64, tokens=16, ndim=4):
    lead = (2,) * (ndim - 3)
    q = jnp.zeros((*lead, heads[0], tokens, head_size), dtype)
    k = jnp.zeros((*lead, heads[1], tokens, head_size), dtype)
    return q, k, k


@pytest.mark.parametrize("change, fits", [
    ({}, True),
    ({"dtype": jnp.float16}, True),
    ({"dtype": jnp.float32}, False),
    ({"platform": "cpu"}, False),
    ({"platform": "tpu"}, False),
    ({"mask": True}, False),
    ({"dropout": 0.1}, False),
    ({"head_size": 72}, True),
    ({"head_size": 128}, True),
    ({"head_size": 100}, False),
    ({"head_size": 256}, False),
    ({"heads": (8, 2)}, True),
    ({"heads": (8, 3)}, False),
    ({"ndim": 3}, False),
])
def test_cudnn_is_chosen_only_where_it_fits(change, fits):
    q, k, v = qkv(change.get("dtype", jnp.bfloat16), change.get("heads", (4, 4)),
                  change.get("head_size", 64), ndim=change.get("ndim", 4))
    mask = jnp.ones((16, 16), bool) if change.get("mask") else None
    found = attention.fused_attention_fits(q, k, v, mask, change.get("dropout", 0.0),
                                           change.get("platform", "cuda"))
    assert found is fits


def _cuda_gpu() -> bool:
    try:
        return "cuda" in jax.devices("gpu")[0].client.platform_version.lower()
    except RuntimeError:
        return False


def test_a_gpu_platform_is_cudas_only_on_an_nvidia_device():
    q, k, v = qkv()
    assert attention.fused_attention_fits(q, k, v, None, 0.0, "gpu") is _cuda_gpu()


def test_without_a_platform_the_default_backend_decides():
    q, k, v = qkv()
    expected = jax.default_backend() == "gpu" and _cuda_gpu()
    assert attention.fused_attention_fits(q, k, v, None, 0.0, None) is expected


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
def test_the_fused_call_maps_torch_layout_scale_causality_and_groups(is_causal, heads):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, heads[0], 8, 16)).astype(np.float32)
    k = rng.standard_normal((2, heads[1], 8, 16)).astype(np.float32)
    v = rng.standard_normal((2, heads[1], 8, 16)).astype(np.float32)
    expected = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), is_causal=is_causal,
        scale=0.3, enable_gqa=heads[0] != heads[1]).numpy()
    found = attention.fused_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                      is_causal, 0.3, implementation="xla")
    # float32 sums of 8 products in another order: a few ulps of values of size ~1.
    np.testing.assert_allclose(np.asarray(found), expected, rtol=1e-5, atol=1e-5)


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.proj(x).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(x.shape[0], x.shape[1], 16)


def test_a_compiled_model_lowers_for_its_backends_platform(monkeypatch):
    seen = []
    fits = attention.fused_attention_fits

    def recording(q, k, v, mask, dropout, platform):
        seen.append(platform)
        return fits(q, k, v, mask, dropout, platform)

    monkeypatch.setattr(attention, "fused_attention_fits", recording)
    model = cstorch.compile(Attention(), cstorch.backend("CPU"))

    @cstorch.trace
    def step(x):
        return model(x).sum()

    step(torch.ones(2, 4, 16))
    model(torch.ones(2, 4, 16))  # an eager call outside a step
    assert seen and set(seen) == {"cpu"}
    seen.clear()
    torch_bridge.convert(Attention(), torch.ones(2, 4, 16))(torch.ones(2, 4, 16))
    assert seen == [jax.default_backend()]  # the bridge alone: JAX's default backend


def test_on_a_gpu_the_fused_kernel_replaces_the_lowering(monkeypatch):
    calls = []

    def fused(q, k, v, is_causal, scale, implementation="cudnn"):
        calls.append((q.dtype, is_causal, scale, implementation))
        return attention.jax.nn.dot_product_attention(
            jnp.swapaxes(q, -3, -2), jnp.swapaxes(k, -3, -2), jnp.swapaxes(v, -3, -2),
            scale=scale, is_causal=is_causal).swapaxes(-3, -2)

    monkeypatch.setattr(attention, "fused_attention", fused)
    q = jnp.ones((1, 2, 4, 8), jnp.bfloat16)
    with torch_bridge.lowering_platform("cuda"):
        out = attention.scaled_dot_product_attention(None, q, q, q, is_causal=True)
    assert calls == [(jnp.bfloat16, True, 1.0 / math.sqrt(8), "cudnn")]
    assert out.shape == q.shape and out.dtype == jnp.bfloat16
    with torch_bridge.lowering_platform("cpu"):
        attention.scaled_dot_product_attention(None, q, q, q, is_causal=True)
    assert len(calls) == 1  # the CPU keeps cerebrax's lowering


class MaskedAttention(torch.nn.Module):
    """Attention with a boolean mask built in ``forward`` from positions alone, as Hugging
    Face's models build their causal mask while exported (``offset`` 0: causal)."""

    def __init__(self, offset: int = 0):
        super().__init__()
        self.offset = offset

    def forward(self, q, k, v):
        t = q.shape[-2]
        rows = torch.arange(t, device=q.device)
        mask = (rows[None, :] <= rows[:, None] + self.offset)[None, None]
        mask = mask.expand(q.shape[0], 1, t, t)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("offset, causal", [(0, True), (1, False), (3, False)])
def test_a_constant_causal_mask_takes_the_fused_kernel(monkeypatch, offset, causal):
    """A mask that depends on no input and is the causal one is the causal flag: the
    GPU then takes cuDNN's kernel (a GPT-2 step in bf16 ran at 0.65x hand-written JAX
    with the mask). Any other mask is kept."""
    calls = []

    def fused(q, k, v, is_causal, scale, implementation="cudnn"):
        calls.append(is_causal)
        return attention.jax.nn.dot_product_attention(
            jnp.swapaxes(q, -3, -2), jnp.swapaxes(k, -3, -2), jnp.swapaxes(v, -3, -2),
            scale=scale, is_causal=is_causal).swapaxes(-3, -2)

    monkeypatch.setattr(attention, "fused_attention", fused)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8).to(torch.bfloat16) for _ in range(3))
    module = MaskedAttention(offset)
    converted = torch_bridge.convert(module, (q, k, v))
    with torch_bridge.lowering_platform("cuda"):
        out = jax.jit(lambda *a: converted.apply({}, {}, *a)[0])(
            *map(torch_bridge.to_jax, (q, k, v)))
    assert calls == ([True] if causal else [])
    want = module(q, k, v).float().numpy()
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_the_cpu_a_constant_causal_mask_changes_no_bit(dtype):
    """The causal flag and the causal mask give the same bits on the CPU, forward and
    backward: the substitution changes nothing there."""
    class Flagged(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8).to(dtype) for _ in range(3))
    args = tuple(map(torch_bridge.to_jax, (q, k, v)))
    results = []
    for module in (MaskedAttention(), Flagged()):
        converted = torch_bridge.convert(module, (q, k, v))

        def loss(*a, converted=converted):
            return jnp.sum(converted.apply({}, {}, *a)[0].astype(jnp.float32) ** 2)

        results.append(jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(*args))
    for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
