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
    assert seen == [None]  # the bridge alone: JAX's default backend


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
