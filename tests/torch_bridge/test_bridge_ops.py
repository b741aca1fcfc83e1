"""Groups of ATen ops against torch eager: outputs and input gradients.

Each group is one module (one export, one compile) returning many results; the
op-by-op coverage test with torch's OpInfo samples is a separate, larger test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from bridge_zoo import rel_err

import torch_bridge

_GEN = torch.Generator().manual_seed(0)
_IMAGE = torch.randn(2, 3, 6, 7, generator=_GEN)
_MATRIX = torch.randn(4, 6, generator=_GEN)
_GRID = torch.rand(2, 5, 4, 2, generator=_GEN) * 2.6 - 1.3
_BAG_INDEX = torch.tensor([1, 2, 3, 0, 3, 2, 1, 3])
_BAG_OFFSETS = torch.tensor([0, 3, 3, 6])


def _pooling(x):
    return (
        F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
        F.max_pool2d(x, 2, 1, dilation=2),
        F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        F.avg_pool2d(x, 3, 2, 1),
        F.adaptive_avg_pool2d(x, (4, 5)),
        F.adaptive_max_pool2d(x, (4, 5)),
        F.interpolate(x, size=(9, 11), mode="bilinear", align_corners=True),
        F.interpolate(x, scale_factor=1.7, mode="bilinear"),
        F.interpolate(x, size=(9, 4), mode="nearest"),
        F.interpolate(x, size=(9, 4), mode="nearest-exact"),
        F.conv_transpose2d(x, torch.ones(3, 2, 3, 3), stride=2, padding=1, dilation=2,
                           output_padding=1),
        F.group_norm(x, 3, torch.arange(3.0), torch.ones(3)),
        F.pad(x, (1, 2, 2, 1), mode="reflect"),
        F.pad(x, (-1, 2, 0, -2), value=3.0),
        F.fold(F.unfold(x, (2, 3), padding=1), (6, 7), (2, 3), padding=1),
        F.grid_sample(x, _GRID, padding_mode="reflection", align_corners=False),
        F.grid_sample(x, _GRID, mode="nearest", padding_mode="border", align_corners=True),
    )


def _elementwise(v):
    a = v.abs()
    return (
        v.exp() + a.log1p() + v.sin() + v.cos().atan() + v.erf() + a.sqrt() + (a + 1).rsqrt(),
        F.softplus(v, 2.0, 1.0) + F.elu(v) + F.selu(v) + F.hardswish(v) + F.mish(v),
        F.silu(v) + F.leaky_relu(v, 0.2) + F.relu6(v) + F.logsigmoid(v) + F.gelu(v),
        (v % 0.7) + torch.fmod(v, 0.7) + v.pow(3) + torch.atan2(v, v.flip(0)) + v.clamp(-0.5, 0.5),
        torch.stack([v.sum(), v.mean(), v.std(), v.var(0).sum(), v.amax(), v.norm(),
                     v.logsumexp(1).sum(), v.prod(), v.cumsum(1).sum(), v.max(1)[0].sum()]),
        torch.topk(v, 2)[0] + torch.sort(v, 1)[0][:, :2],
        F.normalize(v) + F.softmax(v, 0) + F.log_softmax(v, 1) + F.rms_norm(v, (6,)),
        torch.stack([F.mse_loss(v, v.flip(0)), F.smooth_l1_loss(v, v.flip(0)),
                     F.binary_cross_entropy_with_logits(v, (v > 0).float()),
                     F.kl_div(v.log_softmax(1), v.flip(0).softmax(1), reduction="batchmean"),
                     F.cross_entropy(v, v.flip(0).softmax(1))]),
        torch.cdist(v, v.flip(0)) + torch.einsum("ij,kj->ik", v, v),
        F.pdist(v),
    )


def _indexing(v):
    index = torch.tensor([[0, 1], [2, 2], [4, 0], [1, 1]])
    masked = v.clone()
    masked[v > 0.5] = 0.0
    return (
        v[torch.tensor([0, 2, 2])][:, torch.tensor([1, 4])] + v[1:3, ::2].sum(),
        torch.gather(v, 1, index),
        torch.zeros(4, 6).scatter_add(1, index, v[:, :2]),
        torch.ones(4, 6).scatter_reduce(1, index, v[:, :2], "amax", include_self=False),
        v.index_put((torch.tensor([0, 2]),), torch.ones(6), accumulate=True),
        masked + torch.where(v > 0.1, v, -v) + v.masked_fill(v < -1, 2.0),
        torch.cat([*torch.split(v, 2, 1)[::-1]], 1) + v.flip(0) + v.roll(2, 1) + v.tril(),
        F.embedding_bag(_BAG_INDEX, v, _BAG_OFFSETS, mode="max"),
        F.embedding_bag(_BAG_INDEX, v, _BAG_OFFSETS, mode="mean", padding_idx=3),
        torch.view_as_real(torch.fft.rfft(v)),
        torch.fft.irfft(torch.fft.rfft2(v, norm="ortho"), n=6),
    )


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("fn,x", [(_pooling, _IMAGE), (_elementwise, _MATRIX),
                                  (_indexing, _MATRIX)], ids=["pool", "elementwise", "index"])
def test_op_group_matches_torch(fn, x):
    xt = x.clone().requires_grad_(True)
    expected = fn(xt)
    weights = [torch.randn(e.shape, generator=torch.Generator().manual_seed(i))
               for i, e in enumerate(expected)]
    sum(torch.sum(e * w) for e, w in zip(expected, weights)).backward()

    conv = torch_bridge.convert(_Fn(fn))
    jweights = [jnp.asarray(w.numpy()) for w in weights]

    def weighted(z):
        out, _ = conv.apply({}, {}, z)
        return sum(jnp.sum(o * w) for o, w in zip(out, jweights)), out

    grad, out = jax.jit(jax.grad(weighted, has_aux=True))(jnp.asarray(x.numpy()))
    for i, (o, e) in enumerate(zip(out, expected)):
        assert o.shape == tuple(e.shape), i
        assert rel_err(o, e.detach().numpy()) <= 1e-5, i
    assert rel_err(grad, xt.grad.numpy()) <= 1e-5
    np.testing.assert_equal(len(out), len(expected))


@pytest.mark.parametrize("norm", [
    lambda x: torch.linalg.vector_norm(x, dim=-1),
    lambda x: x.norm(dim=-1),
    lambda x: torch.cdist(x[:, None], torch.zeros_like(x)[:, None])[:, 0, 0],
], ids=["vector_norm", "Tensor.norm", "cdist"])
def test_a_norm_is_nan_where_torchs_is_and_zero_at_zero(norm):
    """The 2-norm of a vector holding a NaN is NaN (torch.nn.utils.clip_grad_norm_ reads
    a NaN gradient's norm this way), of the zero vector 0, as torch gives them."""
    x = torch.tensor([[1.0, float("nan")], [0.0, 0.0], [3.0, 4.0]])
    got = np.asarray(torch_bridge.convert(_Fn(norm))(x))
    np.testing.assert_array_equal(got, norm(x).numpy())


@pytest.mark.parametrize("dim, shape, index_shape", [
    (1, (6, 9), (6, 1)),     # nll_loss's pick: one class per row
    (-1, (2, 3, 7), (2, 3, 1)),
    (0, (5, 4), (1, 4)),
    (1, (6, 9), (4, 1)),     # an index smaller than the input in another dim
    (1, (6, 9), (6, 3)),     # several per row, repeats possible: a scatter-add
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gathers_gradient_is_torchs_and_one_pick_is_a_select(dim, shape, index_shape, dtype):
    """torch.gather's gradient equals torch's; where one element is picked per line, it
    is a select against the index, with no scatter into a zeroed copy of the input."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(dtype).requires_grad_()
    index = torch.randint(0, shape[dim], index_shape, generator=g)
    weight = torch.randn(index_shape, generator=g).to(dtype)

    class Gather(nn.Module):
        def forward(self, x, index):
            return torch.gather(x, dim, index)

    (Gather()(x, index) * weight).sum().backward()
    converted = torch_bridge.convert(Gather(), (x.detach(), index))
    jindex, jweight = torch_bridge.to_jax(index), torch_bridge.to_jax(weight)

    def loss(jx):
        return jnp.sum((converted.apply({}, {}, jx, jindex)[0] * jweight).astype(jnp.float32))

    jx = torch_bridge.to_jax(x.detach())
    got = jax.jit(jax.grad(loss))(jx)
    np.testing.assert_array_equal(np.asarray(got, np.float32), x.grad.float().numpy())
    scatters = str(jax.make_jaxpr(jax.grad(loss))(jx)).count("scatter")
    assert (scatters == 0) == (index_shape[dim] == 1)
