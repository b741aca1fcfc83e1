"""The bridge's graph rewrites (torch_bridge/_rewrites.py): memory and exactness.

``nn.MultiheadAttention(batch_first=True)`` exports its input projection as a batched
product against the weight expanded once per sequence position, and takes q, k, v from
the packed projection with one ``select`` each. Lowered as written, XLA materializes the
expanded weight (forward) and pads every select's cotangent to the packed shape
(gradient). With the rewrites, the compiled temporaries are those of the same model
written by hand in JAX (``q, k, v = x @ W.T + b``, then attention), and the numbers are
torch's.
"""

from __future__ import annotations

import copy
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
from bridge_zoo import rel_err, seeded

import torch_bridge
from torch_bridge import _export

aten = torch.ops.aten

D, HEADS, FF, SEQ, BATCH = 768, 12, 3072, 197, 4  # ViT-B/16 at 224x224, batch 4


class SelfAttention(nn.Module):
    def __init__(self, d: int = D, heads: int = HEADS):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def encoder_layer(d: int = D, heads: int = HEADS, ff: int = FF) -> nn.Module:
    return nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)


# ---- the same models written by hand in JAX -------------------------------------------
def _linear(p: dict, name: str, x: jax.Array) -> jax.Array:
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def reference_attention(p: dict, x: jax.Array, heads: int, prefix: str) -> jax.Array:
    """``nn.MultiheadAttention`` self-attention: ``q, k, v = x @ W.T + b``, attention."""
    n, t, d = x.shape
    qkv = x @ p[f"{prefix}in_proj_weight"].T + p[f"{prefix}in_proj_bias"]
    q, k, v = (z.reshape(n, t, heads, d // heads).transpose(0, 2, 1, 3)
               for z in jnp.split(qkv, 3, axis=-1))
    weights = jax.nn.softmax((q / math.sqrt(d // heads)) @ k.swapaxes(-1, -2), axis=-1)
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(n, t, d)
    return _linear(p, f"{prefix}out_proj", out)


def _layer_norm(p: dict, name: str, x: jax.Array) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * p[f"{name}.weight"] + p[f"{name}.bias"]


def reference_encoder_layer(p: dict, x: jax.Array, heads: int) -> jax.Array:
    """``nn.TransformerEncoderLayer`` (post-norm, ReLU, no dropout)."""
    x = _layer_norm(p, "norm1", x + reference_attention(p, x, heads, "self_attn."))
    hidden = jax.nn.relu(_linear(p, "linear1", x))
    return _layer_norm(p, "norm2", x + _linear(p, "linear2", hidden))


MODELS = {
    "MultiheadAttention": (SelfAttention, lambda p, x: reference_attention(p, x, HEADS, "attn.")),
    "TransformerEncoderLayer": (encoder_layer,
                                lambda p, x: reference_encoder_layer(p, x, HEADS)),
}


def temp_bytes(fn, *args) -> int:
    """XLA's temporary buffer bytes for ``jax.jit(fn)`` on these arguments (compiled
    only, not run)."""
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def vjp(fn):
    """``(p, x, ct) -> ``fn``'s gradient in ``p`` and ``x`` of the loss sum(out * ct)."""
    return jax.grad(lambda p, x, ct: jnp.sum(fn(p, x) * ct), argnums=(0, 1))


def bridged(module: nn.Module):
    conv = torch_bridge.convert(module)
    return conv, lambda p, x: conv.apply(p, conv.buffers, x)[0]


def torch_vjp(module: nn.Module, args: list, ct: torch.Tensor) -> tuple:
    """torch's gradients of sum(module(*args) * ct) in the inputs and the parameters (by
    name), computed in float64: float32 eager is itself ~3e-4 off them through a
    LayerNorm, more than the bridge (~2e-7)."""
    exact = copy.deepcopy(module).double()
    inputs = [a.double().requires_grad_(True) for a in args]
    exact(*inputs).backward(ct.double())
    return [a.grad.numpy() for a in inputs], {
        name: p.grad.numpy() for name, p in exact.named_parameters()}


@pytest.fixture(scope="module")
def inputs():
    gen = torch.Generator().manual_seed(1)
    x, ct = torch.randn(BATCH, SEQ, D, generator=gen), torch.randn(BATCH, SEQ, D, generator=gen)
    return x, ct, jnp.asarray(x.numpy()), jnp.asarray(ct.numpy())


@pytest.mark.parametrize("mode", ["forward", "gradient"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_temporaries_are_those_of_the_plain_matmul(model, mode, inputs):
    make, reference = MODELS[model]
    conv, fn = bridged(seeded(make))
    args = (conv.params, inputs[2])
    if mode == "gradient":
        fn, reference, args = vjp(fn), vjp(reference), (*args, inputs[3])
    ours = temp_bytes(fn, *args)
    plain = temp_bytes(reference, *args)
    assert ours <= 1.1 * plain, (f"{model} {mode}: {ours / 2**20:.1f} MiB of temporaries, "
                                 f"the plain formulation {plain / 2**20:.1f} MiB")


def test_without_the_rewrites_the_expanded_weight_is_materialized(monkeypatch, inputs):
    monkeypatch.setenv("CEREBRAX_EXPORT_CACHE", "0")  # exported here, without rewrites
    monkeypatch.setattr(_export, "rewrite", lambda program: program)
    conv, fn = bridged(seeded(SelfAttention))
    expanded = SEQ * D * 3 * D * 4  # the in-projection weight, once per position
    assert temp_bytes(fn, conv.params, inputs[2]) >= expanded
    assert not conv.programs[0].ops.count(str(aten.matmul.default))


@pytest.mark.parametrize("model", sorted(MODELS))
def test_outputs_and_gradients_match_torch(model, inputs):
    make, _ = MODELS[model]
    module = seeded(make)
    conv, fn = bridged(module)
    x, ct, xj, ctj = inputs
    with torch.no_grad():
        out = module(x)
    assert rel_err(jax.jit(fn)(conv.params, xj), out.numpy()) <= 1e-5
    grads, dx = jax.jit(vjp(fn))(conv.params, xj, ctj)
    (want_dx,), want = torch_vjp(module, [x], ct)
    assert rel_err(dx, want_dx) <= 1e-5
    for name, value in want.items():
        assert rel_err(grads[name], value) <= 1e-5, name
    ops = conv.programs[0].ops
    assert str(aten.bmm.default) not in ops and str(aten.select.int) not in ops, ops


# ---- where torch emits the patterns: every one rewritten, every result exact -----------
class Linear3d(nn.Module):
    """``F.linear`` on a transposed 3-d / 4-d input (leading dims that do not fold)."""

    def __init__(self, perm):
        super().__init__()
        self.perm = perm
        self.fc = nn.Linear(16, 24)

    def forward(self, x):
        return self.fc(x.permute(*self.perm))


class CrossAttention(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True, **kwargs)

    def forward(self, x, memory):
        return self.attn(x, memory, memory[..., : self.attn.vdim], need_weights=False)[0]


class Unbind(nn.Module):
    """timm's attention unpacking: ``q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)``."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        n, t, _ = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, 4, 4).permute(2, 0, 3, 1, 4).unbind(0)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


class BatchedProducts(nn.Module):
    """Products the rewrites must leave alone: a true bmm, an incomplete partition."""

    def forward(self, a, b):
        head = a[:, :2] @ b  # a slice that is not part of a partition
        return head.sum() + (a @ b).sum()


def _memory(n=4, t=7, d=16):
    return torch.randn(n, t, d, generator=torch.Generator().manual_seed(2))


CASES = {
    "mha": (lambda: SelfAttention(16, 4), lambda: (_memory(t=5),)),
    "mha_cross": (CrossAttention, lambda: (_memory(t=5), _memory())),
    "mha_kdim_vdim": (lambda: CrossAttention(kdim=16, vdim=8), lambda: (_memory(t=5), _memory())),
    "encoder_layer": (lambda: encoder_layer(16, 4, 32), lambda: (_memory(t=5),)),
    "encoder_norm_first": (
        lambda: nn.TransformerEncoderLayer(16, 4, 32, 0.0, batch_first=True, norm_first=True),
        lambda: (_memory(t=5),)),
    "decoder_layer": (lambda: nn.TransformerDecoderLayer(16, 4, 32, 0.0, batch_first=True),
                      lambda: (_memory(t=5), _memory())),
    "linear_3d": (lambda: Linear3d((1, 0, 2)), lambda: (_memory(),)),
    "linear_4d": (lambda: Linear3d((2, 0, 1, 3)), lambda: (_memory().reshape(2, 2, 7, 16),)),
    "unbind": (Unbind, lambda: (_memory(),)),
    "batched": (BatchedProducts, lambda: (_memory(t=5, d=3), _memory(t=3, d=6))),
}


def _broadcast_bmms(program) -> list[str]:
    found = []
    for node in program.nodes:
        if node.target is aten.bmm.default:
            for arg in node.args:
                while arg.target in (aten.view.default, aten.clone.default):
                    arg = arg.args[0]
                src = arg.args[0] if arg.target is aten.expand.default else None
                if src is not None and math.prod(src.meta["val"].shape[:-2]) == 1:
                    found.append(node.name)
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_rewritten_graphs_match_torch(case):
    make, example = CASES[case]
    module = seeded(make)
    args = example()
    conv = torch_bridge.convert(module)
    program = conv.program(args, {})
    assert not _broadcast_bmms(program)
    with torch.no_grad():
        out = module(*args)
    ct = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    want_dx, want = torch_vjp(module, args, ct)

    def loss(p, *xs):
        return jnp.sum(conv.apply(p, conv.buffers, *xs)[0] * jnp.asarray(ct.numpy()))

    jargs = [jnp.asarray(a.numpy()) for a in args]
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args) + 1))))(
        conv.params, *jargs)
    assert rel_err(value, (out * ct).sum().item()) <= 1e-5
    for got, value in zip(grads[1:], want_dx):
        assert rel_err(got, value) <= 1e-5
    for name, value in want.items():
        assert rel_err(grads[0][name], value) <= 1e-5, name


def test_what_the_rewrites_produce():
    ops = {case: torch_bridge.convert(seeded(make)).program(example(), {}).ops
           for case, (make, example) in CASES.items()}
    assert str(aten.matmul.default) in ops["linear_4d"]
    assert str(aten.bmm.default) not in ops["linear_4d"]
    assert str(aten.split_with_sizes.default) in ops["unbind"]
    assert str(aten.slice.Tensor) not in ops["unbind"]
    # a bmm of two batched operands and a slice that partitions nothing stay as they are
    assert {str(aten.bmm.default), str(aten.slice.Tensor)} <= set(ops["batched"])
    assert str(aten.split_with_sizes.default) not in ops["batched"]


def test_split_is_one_concatenate_in_the_gradient():
    conv = torch_bridge.convert(seeded(Unbind))
    x = jnp.asarray(_memory().numpy())
    jaxpr = jax.make_jaxpr(jax.grad(lambda p: jnp.sum(conv.apply(p, {}, x)[0])))(conv.params)
    prims = [eqn.primitive.name for eqn in jaxpr.jaxpr.eqns]
    assert "pad" not in prims and prims.count("concatenate") == 1, prims


def test_piece_order_follows_the_dim_not_the_graph():
    # pieces used in reverse order still map to the right split outputs
    class Reversed(nn.Module):
        def forward(self, x):
            return x[2] * 100 + x[1] * 10 + x[0]

    conv = torch_bridge.convert(Reversed())
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    program = conv.program((torch.from_numpy(x),), {})
    assert any(n.target is operator.getitem for n in program.nodes)
    np.testing.assert_array_equal(conv(x), x[2] * 100 + x[1] * 10 + x[0])


# ---- grouped convolutions on CPU ---------------------------------------------------------
CHANNELS, KERNEL = 512, 5  # an EfficientNet depthwise layer, narrower


def _depthwise(groups: int = CHANNELS) -> nn.Module:
    return nn.Conv2d(CHANNELS, CHANNELS, KERNEL, stride=2, padding=2, groups=groups)


@pytest.mark.parametrize("groups", [CHANNELS, 4])
def test_grouped_convolution_weight_gradient_builds_no_dense_kernel(groups):
    """JAX's rule for a grouped convolution's weight gradient is a convolution with
    ``batch_group_count``, which XLA's CPU backend rewrites into a dense one over a
    masked (C, C, k, k) kernel; the bridge's lowering computes it per kernel offset."""
    from torch_bridge.ops import conv as conv_ops

    module = seeded(lambda: _depthwise(groups))
    x = torch.randn(2, CHANNELS, 16, 16, generator=torch.Generator().manual_seed(2))
    ct = torch.randn(2, CHANNELS, 8, 8, generator=torch.Generator().manual_seed(3))
    conv, fn = bridged(module)
    args = (conv.params, jnp.asarray(x.numpy()), jnp.asarray(ct.numpy()))
    dense = CHANNELS * CHANNELS * KERNEL * KERNEL * 4
    padded_input = x.numel() // 16 ** 2 * 20 ** 2 * 4
    ours = temp_bytes(vjp(fn), *args)
    # A few activation-sized buffers (padded input, input gradient, windows), far
    # below the dense kernel (here 25 MiB against a padded input of 1.6 MiB).
    assert ours <= 6 * padded_input < dense / 2, f"{ours / 2**20:.2f} MiB of temporaries"
    with pytest.MonkeyPatch.context() as patch:  # JAX's own rule, for comparison
        patch.setattr(conv_ops, "_grouped_conv", conv_ops._plain_conv)
        if groups == CHANNELS:
            assert temp_bytes(vjp(bridged(module)[1]), *args) >= dense
    dp, dx = vjp(fn)(*args)
    (tx,), tp = torch_vjp(module, [x], ct)
    assert rel_err(dx, tx) < 1e-5
    for name in ("weight", "bias"):
        assert rel_err(dp[name], tp[name]) < 1e-5, name
