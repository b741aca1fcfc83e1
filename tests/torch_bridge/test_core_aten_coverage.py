"""Core ATen coverage: every core ATen overload has a lowering or a skip reason, and the
lowerings no OpInfo sample reaches (ATen's backward kernels, ``empty_permuted``,
``histc`` and others) are compared with torch eager here, each on a direct call.

The OpInfo-driven comparison of everything else is test_bridge_opinfo.py.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
import pytest
import torch
from opinfo_table import CORE_SKIPS
from test_bridge_opinfo import compare, core_aten_ops

import torch_bridge
from torch_bridge import to_jax

aten = torch.ops.aten


class _Call(torch.nn.Module):
    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _bridge(fn: Callable, *inputs: torch.Tensor, train: bool = False):
    """The outputs of ``fn`` through the bridge under ``jax.jit``, and torch's."""
    module = _Call(fn).train(train)
    expected = module(*inputs)
    conv = torch_bridge.convert(module, train=train)
    actual, _ = jax.jit(lambda *xs: conv.apply({}, {}, *xs))(*map(to_jax, inputs))
    return actual, expected


def _leaves(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _conv_case(transposed: bool):
    x = _randn(2, 4, 9, 9)
    if transposed:  # in 4, out 6 in 2 groups, stride 2, padding 1: 17x17
        w, grad = _randn(4, 3, 3, 3, seed=1), _randn(2, 6, 17, 17, seed=2)
    else:
        w, grad = _randn(6, 2, 3, 3, seed=1), _randn(2, 6, 5, 5, seed=2)

    def fn(g, x, w):
        return aten.convolution_backward(g, x, w, [6], [2, 2], [1, 1], [1, 1], transposed,
                                         [0, 0], 2, [True, True, True])

    return fn, (grad, x, w)


def _max_pool_case():
    x = _randn(2, 3, 9, 8)
    out, idx = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1], [1, 1], True)

    def fn(g, x, i):
        return aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1],
                                                      True, i)

    return fn, (_randn(*out.shape, seed=1), x, idx)


def _layer_norm_case():
    x, w, b = _randn(3, 5, 8), _randn(8, seed=1), _randn(8, seed=2)
    _, mean, rstd = aten.native_layer_norm(x, [8], w, b, 1e-3)

    def fn(g, x, mean, rstd, w, b):
        return aten.native_layer_norm_backward(g, x, [8], mean, rstd, w, b,
                                               [True, True, True])

    return fn, (_randn(3, 5, 8, seed=3), x, mean, rstd, w, b)


def _group_norm_case():
    x, w, b = _randn(2, 6, 3, 4), _randn(6, seed=1), _randn(6, seed=2)
    _, mean, rstd = aten.native_group_norm(x, w, b, 2, 6, 12, 3, 1e-3)

    def fn(g, x, mean, rstd, w):
        return aten.native_group_norm_backward(g, x, mean, rstd, w, 2, 6, 12, 3,
                                               [True, True, True])

    return fn, (_randn(2, 6, 3, 4, seed=3), x, mean, rstd, w)


def _embedding_case(padding_idx: int, scale: bool):
    indices = torch.tensor([[0, 2, 2], [5, 0, 1]])

    def fn(g, i):
        return aten.embedding_dense_backward(g, i, 7, padding_idx, scale)

    return fn, (_randn(2, 3, 4), indices)


def _empty_permuted(x):
    return torch.empty_permuted((2, 3, 4), (0, 2, 1), dtype=x.dtype).copy_(x) * 2


def _grouped_rows():
    """Nine rows sorted into 4 groups of 3, 0, 4 and 2 rows (torch leaves rows past the
    last offset unwritten, the bridge zeroes them, as transformers' fallback does).
    (torch exports grouped matmuls in bfloat16 only.)"""
    offs = torch.tensor([3, 3, 7, 9], dtype=torch.int32)
    return (lambda x, w: torch._grouped_mm(x, w, offs=offs),
            (_randn(9, 8).bfloat16(), _randn(4, 8, 16, seed=1).bfloat16()))


# name -> (fn, inputs, (rtol, atol)); the overloads each case reaches are in its name.
CASES: dict[str, tuple] = {
    "convolution_backward": (*_conv_case(False), (1e-4, 1e-4)),
    "convolution_backward.transposed": (*_conv_case(True), (1e-4, 1e-4)),
    "avg_pool2d_backward": (
        lambda g, x: aten.avg_pool2d_backward(g, x, [3, 3], [2, 2], [1, 1], True, False,
                                              None),
        (_randn(2, 4, 5, 5), _randn(2, 4, 9, 9, seed=1)), (1e-5, 1e-6)),
    "_adaptive_avg_pool2d_backward": (
        aten._adaptive_avg_pool2d_backward, (_randn(2, 4, 4, 5), _randn(2, 4, 9, 9, seed=1)),
        (1e-5, 1e-6)),
    "max_pool2d_with_indices_backward": (*_max_pool_case(), (1e-5, 1e-6)),
    "embedding_dense_backward": (*_embedding_case(2, True), (1e-5, 1e-6)),
    "embedding_dense_backward.no_padding": (*_embedding_case(-1, False), (1e-5, 1e-6)),
    "native_layer_norm_backward": (*_layer_norm_case(), (1e-4, 1e-5)),
    "native_group_norm_backward": (*_group_norm_case(), (1e-4, 1e-5)),
    "histc": (lambda x: torch.histc(x, 10), (_randn(1000),), (0, 0)),
    "histc.range": (lambda x: torch.histc(x, 7, -1.0, 1.0), (_randn(1000),), (0, 0)),
    "histc.constant": (lambda x: torch.histc(x, 5), (torch.ones(4),), (0, 0)),
    "_grouped_mm.rows": (*_grouped_rows(), (1.6e-2, 1e-2)),
    "_grouped_mm.batched": (lambda a, b: torch._grouped_mm(a, b),
                            (_randn(3, 4, 8).bfloat16(), _randn(3, 8, 16, seed=1).bfloat16()),
                            (1.6e-2, 1e-2)),
    **{f"grid_sampler_2d.bicubic.{pad}": (
        lambda x, g, pad=pad: torch.nn.functional.grid_sample(
            x, g, mode="bicubic", padding_mode=pad, align_corners=pad == "reflection"),
        (_randn(2, 3, 5, 7), _randn(2, 4, 6, 2, seed=1).clamp(-1.3, 1.3)), (1e-5, 1e-5))
       for pad in ("zeros", "border", "reflection")},
    "empty_permuted": (_empty_permuted, (_randn(2, 3, 4),), (0, 0)),
    "empty_strided": (
        lambda x: torch.empty_strided((2, 3), (1, 2)).copy_(x) + 1, (_randn(2, 3),), (0, 0)),
    "select_scatter": (
        lambda x, y: torch.select_scatter(x, y, 1, 2), (_randn(3, 4), _randn(3, seed=1)),
        (0, 0)),
    "reflection_pad2d": (
        lambda x: torch.nn.functional.pad(x, (1, 2, 2, 1), mode="reflect"),
        (_randn(2, 3, 5, 6),), (0, 0)),
    "replication_pad3d": (
        lambda x: torch.nn.functional.pad(x, (1, 2, 2, 1, 0, 1), mode="replicate"),
        (_randn(1, 2, 3, 4, 5),), (0, 0)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name):
    fn, inputs, (rtol, atol) = CASES[name]
    actual, expected = _bridge(fn, *inputs)
    actual, expected = _leaves(actual), _leaves(expected)
    assert [a is None for a in actual] == [e is None for e in expected]
    kept = [(a, e) for a, e in zip(actual, expected) if e is not None]
    problem = compare([a for a, _ in kept], [e for _, e in kept], rtol, atol)
    assert not problem, f"{name}: {problem}"


def test_inplace_dropout_in_training():
    """nn.Dropout(inplace=True) in train mode exports to empty_permuted + bernoulli_: the
    bridge's mask differs from torch's generator, so this checks the law instead: every
    output is 0 or x / (1 - p), and about p of them are 0."""
    x = _randn(64, 64).abs() + 1.0
    module = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Dropout(0.25, inplace=True))
    module.train()
    conv = torch_bridge.convert(module, train=True)
    program = conv.program((x,))
    assert aten.empty_permuted.default in {n.target for n in program.nodes}
    out, _ = conv.apply({}, {}, to_jax(x), key=jax.random.key(0))
    out, scaled = np.asarray(out), x.numpy() / 0.75
    dropped = out == 0
    np.testing.assert_allclose(out[~dropped], scaled[~dropped], rtol=1e-6)
    assert 0.2 < dropped.mean() < 0.3


def test_every_core_op_is_lowered_or_skipped():
    """A core ATen overload that a newer torch adds fails here until it gets a lowering
    or a CORE_SKIPS entry; a CORE_SKIPS entry for a lowered or unknown op fails too."""
    core = {str(op) for op in core_aten_ops()}
    lowered = set(torch_bridge.lowered_ops())
    missing = sorted(core - lowered - set(CORE_SKIPS))
    stale = sorted(op for op in CORE_SKIPS if op not in core or op in lowered)
    print(f"core ATen overloads: {len(core & lowered)}/{len(core)} lowered, "
          f"{len(CORE_SKIPS)} skipped:")
    print("\n".join(f"  {op}: {reason}" for op, reason in sorted(CORE_SKIPS.items())))
    assert not missing, f"core ATen overloads with neither a lowering nor a skip: {missing}"
    assert not stale, f"CORE_SKIPS entries that are lowered or not core: {stale}"
    assert len(core) >= 180, f"only {len(core)} core overloads found: enumeration broke"


def test_embedding_max_norm_renormalizes_and_trains_like_torch():
    """nn.Embedding(max_norm=...) renormalizes the looked-up rows in place through a
    detached alias of its weight (the export keeps that write: a stop-gradient copy would
    lose it); outputs and the weight's gradient match torch eager."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4, max_norm=1.0, norm_type=1.0)
    indices = torch.tensor([[1, 2, 2], [5, 1, 0]])
    conv = torch_bridge.convert(emb)
    params = dict(conv.params)

    def loss(p):
        out, _ = conv.apply(p, {}, to_jax(indices))
        return (out ** 2).sum(), out

    (_, out), grad = jax.value_and_grad(loss, has_aux=True)(params)
    expected = emb(indices)
    (expected ** 2).sum().backward()
    assert not compare([out], [expected], 1e-6, 1e-6)
    assert not compare([grad["weight"]], [emb.weight.grad], 1e-6, 1e-6)
    assert float(expected.detach().abs().sum(-1).max()) <= 1.0 + 1e-6  # rows renormalized
