"""Half-precision arithmetic with a scalar gives torch eager's bits, forward and backward.

torch computes ``x * 0.1`` for a float16 ``x`` with 0.1 in float32 and rounds once; ``x +
0.1`` with 0.1 rounded to float16; ``add(x, y, alpha=0.1)`` in float32 with alpha
rounded; ``x * torch.tensor(0.1)`` is float16 (a 0-dim tensor does not promote a tensor
with dimensions). Before ``ops/_scalar_ops.py``, 13-35% of elements of each differed,
and the last was float32.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_bridge

HALF = [torch.float16, torch.bfloat16]
OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
       "div": operator.truediv}


def _scalar(kind: str, value: float):
    if kind == "python":
        return value
    if kind == "tensor0d":
        return torch.tensor(value)  # float32
    if kind == "int0d":
        return torch.tensor(int(value * 10) + 1)
    return torch.tensor(value, dtype=torch.float16)  # half0d


CASES = [(op, kind, first) for op in OPS for kind in ("python", "tensor0d", "int0d", "half0d")
         for first in (False, True) if not (kind == "python" and first)]


def _compare(module, tensors, dtype, rtol=0.0):
    """Forward and the gradients of the tensors that require one, against torch eager:
    equal, or within ``rtol`` (float32, where XLA fuses products into FMAs)."""
    weight = torch.randn(module(*tensors).shape,
                         generator=torch.Generator().manual_seed(7)).to(dtype)
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    out = module(*leaves)
    (out * weight).sum().backward()

    converted = torch_bridge.convert(module, tuple(t.detach() for t in tensors))
    jweight = torch_bridge.to_jax(weight)
    wanted = [i for i, t in enumerate(tensors) if t.requires_grad]

    def loss(*a):
        y = converted.apply({}, {}, *a)[0]
        return jnp.sum((y * jweight).astype(jnp.float32)), y

    args = [torch_bridge.to_jax(t.detach()) for t in tensors]
    grads, got = jax.jit(jax.grad(loss, argnums=tuple(wanted), has_aux=True))(*args)
    assert got.dtype == torch_bridge.to_jax(out.detach()).dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), out.detach().float().numpy(),
                               rtol=rtol, atol=0)
    for i, g in zip(wanted, grads):
        assert g.dtype == args[i].dtype
        np.testing.assert_allclose(np.asarray(g, np.float32), leaves[i].grad.float().numpy(),
                                   rtol=rtol, atol=0, err_msg=f"grad {i}")


@pytest.mark.parametrize("op, kind, first", CASES)
@pytest.mark.parametrize("dtype", HALF)
def test_a_half_tensor_and_a_scalar(op, kind, first, dtype):
    x = torch.randn(256, generator=torch.Generator().manual_seed(0)).to(dtype)
    x.requires_grad_()
    scalar = _scalar(kind, 3.3 if op == "div" else 0.1)
    fn = OPS[op]

    if kind == "python" or kind == "int0d":
        class M(torch.nn.Module):
            def forward(self, x):
                return fn(scalar, x) if first else fn(x, scalar)

        _compare(M(), [x], dtype)
    else:  # a 0-dim tensor input, learning too where it is floating
        s = scalar.clone().requires_grad_()

        class M(torch.nn.Module):
            def forward(self, x, s):
                return fn(s, x) if first else fn(x, s)

        _compare(M(), [x, s], dtype)


@pytest.mark.parametrize("op", ["add", "sub", "rsub"])
@pytest.mark.parametrize("dtype", HALF)
def test_alpha_of_a_half_sum(op, dtype):
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randn(256, generator=g).to(dtype).requires_grad_() for _ in range(2))
    fn = {"add": torch.add, "sub": torch.sub, "rsub": torch.rsub}[op]

    class M(torch.nn.Module):
        def forward(self, x, y):
            return fn(x, y, alpha=0.1)

    _compare(M(), [x, y], dtype)


def test_float32_and_mixed_operands_keep_torchs_promotion():
    """A float32 tensor with a float16 0-dim tensor is float32; a float16 tensor with a
    float32 tensor with dimensions is float32; float32 by a scalar is unchanged."""
    g = torch.Generator().manual_seed(2)
    x32 = torch.randn(64, generator=g).requires_grad_()
    x16 = torch.randn(64, generator=g).half().requires_grad_()

    class M(torch.nn.Module):
        def forward(self, a, b):
            return a * torch.tensor(0.1, dtype=torch.float16) + b * a * 0.3 - a / 7.0

    _compare(M(), [x32, x16], torch.float32, rtol=1e-6)


CHAINS = {
    "x * 0.1 * 0.3 + y": lambda x, y: x * 0.1 * 0.3 + y,
    "x / 3.3 / 7.1 - y": lambda x, y: x / 3.3 / 7.1 - y,
    "(x / y) / x": lambda x, y: (x / y) / x,     # XLA would fold it into x / (y * x)
    "x * 0.1 + x * y": lambda x, y: x * 0.1 + x * y,
    "0.5 * x * (1 + y)": lambda x, y: 0.5 * x * (1.0 + y),  # GELU's outer arithmetic
    "add(x, y * 0.3, alpha=-0.7) / 0.9": lambda x, y: torch.add(x, y * 0.3, alpha=-0.7) / 0.9,
}


@pytest.mark.parametrize("name", CHAINS)
@pytest.mark.parametrize("dtype", HALF)
def test_chains_of_half_operations_round_at_each_step(name, dtype):
    """Each operation rounds, as in torch eager: XLA neither folds two divisions into
    one nor keeps a product unrounded (``kept``, ``rounded_product``). (Functions such as
    ``tanh`` and ``pow`` round otherwise in places; their half-precision results are held
    to bounds by the OpInfo tests.)"""
    g = torch.Generator().manual_seed(3)
    x, y = (torch.randn(4096, generator=g).to(dtype).requires_grad_() for _ in range(2))
    fn = CHAINS[name]

    class M(torch.nn.Module):
        def forward(self, x, y):
            return fn(x, y)

    _compare(M(), [x, y], dtype)


ZERO_DIM = {
    "maximum": lambda x, t: torch.maximum(x, t),
    "where": lambda x, t: torch.where(x > 0, x, t),
    "comparison": lambda x, t: (x > t).to(x.dtype),
    "pow": lambda x, t: torch.pow(x.abs() + 1, t * 20),
    "clamp": lambda x, t: torch.clamp(x, min=t),
    "atan2": lambda x, t: torch.atan2(x, t),
    "remainder": lambda x, t: torch.remainder(x, t * 3),
    "hypot": lambda x, t: torch.hypot(x, t),
}


@pytest.mark.parametrize("name", ZERO_DIM)
@pytest.mark.parametrize("dtype", HALF)
def test_a_zero_dim_float32_tensor_does_not_promote_a_half_one(name, dtype):
    """``op(x, torch.tensor(0.1))`` for a half ``x`` is half, computed with the 0-dim
    tensor rounded to the half dtype, as in torch (JAX alone gives float32)."""
    x = torch.randn(512, generator=torch.Generator().manual_seed(4)).to(dtype)
    fn = ZERO_DIM[name]

    class M(torch.nn.Module):
        def forward(self, x):
            return fn(x, torch.tensor(0.1))

    want = M()(x)
    converted = torch_bridge.convert(M(), (x,))
    got = jax.jit(lambda a: converted.apply({}, {}, a)[0])(torch_bridge.to_jax(x))
    assert got.dtype == torch_bridge.to_jax(want).dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), want.float().numpy())


@pytest.mark.parametrize("dtype", HALF)
def test_a_half_result_widened_to_float32_is_rounded_first(dtype):
    """``(x + y).float()``: on a CPU, XLA computes a bfloat16 sum in float32 and would
    hand it to the cast unrounded (35252 of 65536 elements differed from torch)."""
    g = torch.Generator().manual_seed(5)
    x, y = (torch.randn(4096, generator=g).to(dtype).requires_grad_() for _ in range(2))

    class M(torch.nn.Module):
        def forward(self, x, y):
            return (x + y).float() * 3.0 + torch.exp(x).float()

    _compare(M(), [x, y], torch.float32)


F = torch.nn.functional
ACTIVATIONS = {
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "mish": F.mish, "elu": F.elu, "softplus": F.softplus, "hardsigmoid": F.hardsigmoid,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "sqrt": lambda x: torch.sqrt(x.abs()),
}


def _ulps(got, want, dtype):
    """Elementwise distance in units in the last place of ``dtype`` at ``want``."""
    spacing = np.spacing(np.abs(want).astype(np.float32)) * 2.0 ** (
        23 - (10 if dtype == torch.float16 else 7))
    return np.abs(got - want) / np.maximum(spacing, np.finfo(np.float32).tiny)


def _unary_pass(fn, x, weight):
    """``fn(x)`` and the gradient of ``sum(fn(x) * weight)`` in torch eager and through
    the bridge: ``((bridge output, bridge gradient), (torch output, torch gradient))``,
    each as float32 numpy arrays."""

    class M(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    x = x.detach().clone().requires_grad_()
    out = M()(x)
    (out * weight).sum().backward()
    converted = torch_bridge.convert(M(), (x.detach(),))
    jweight = torch_bridge.to_jax(weight)

    def loss(a):
        y = converted.apply({}, {}, a)[0]
        return jnp.sum((y * jweight).astype(jnp.float32)), y

    grad, got = jax.jit(jax.grad(loss, has_aux=True))(torch_bridge.to_jax(x.detach()))
    return ((np.asarray(got, np.float32), np.asarray(grad, np.float32)),
            (out.detach().float().numpy(), x.grad.float().numpy()))


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("dtype", HALF)
def test_half_activations_round_once_as_torchs_kernels(name, dtype):
    """A half-precision activation computes in float32 and rounds once, as torch's CPU
    kernels do (computed in the half dtype, 30-40% of a bf16 gelu's elements differed):
    forward and gradient within one unit in the last place of torch's, and equal on all
    but a few elements (float32 approximations of erf, exp and tanh differ in their last
    bits, which can tip a rounding)."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(8192, generator=g).to(dtype)
    weight = torch.randn(8192, generator=g).to(dtype)
    mine_pair, theirs_pair = _unary_pass(ACTIVATIONS[name], x, weight)
    for what, mine, theirs in zip(("output", "gradient"), mine_pair, theirs_pair):
        assert np.all(_ulps(mine, theirs, dtype) <= 1.0), what
        assert int((mine != theirs).sum()) <= 0.005 * mine.size, what


@pytest.mark.parametrize("exponent", [3, 4, 5, -1, -2, -3])
@pytest.mark.parametrize("dtype", HALF)
def test_half_integer_powers_give_torchs_bits(exponent, dtype):
    """``x ** n``: torch's CPU kernels compute float16 powers and bfloat16's other than
    ``x ** 3`` and ``x ** -2`` in float32 and round once, and round each product of those
    two; the gradient is torch's ``g * (n * x ** (n - 1))`` rounded by the same rules.
    Where every product was rounded, 24-48% of the outputs differed. Output and gradient
    are equal."""
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(16384, generator=g) * 3).to(dtype)
    weight = torch.randn(16384, generator=g).to(dtype)
    (got, grad), (want, want_grad) = _unary_pass(lambda v: v ** exponent, x, weight)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(grad, want_grad, equal_nan=True)
