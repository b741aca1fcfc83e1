"""Half-precision gradients of broadcast operands are summed as torch sums them.

torch's backward of a broadcast operand (a Linear's bias, a BatchNorm's weight, a
bias added with ``+``) sums the incoming gradient in float32 and rounds the sum once
to float16 or bfloat16. JAX's transpose of a broadcast sums in the operand's dtype,
and XLA on CPU then accumulates in float16: over a batch of a few hundred rows that
is more than a unit of roundoff off torch's gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_bridge


class _Biases(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)  # addmm's bias
        self.shift = torch.nn.Parameter(torch.randn(4))  # a pointwise add's operand
        self.bn = torch.nn.BatchNorm1d(4)  # the affine weight and bias

    def forward(self, x):
        return self.fc(x) + self.shift + self.bn(x[:, :4])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_broadcast_gradients_are_rounded_once_as_torchs(dtype):
    """The loss is sum(y * w), so each bias's gradient is the column sum of ``w``: its
    exact value is known, and torch's is that value rounded once. The bridge's must
    be within half a unit in the last place of it too (it was 1.3 units off)."""
    torch.manual_seed(0)
    model = _Biases().to(dtype)
    x = torch.randn(4096, 8).to(dtype)
    weights = torch.randn(4096, 4).to(dtype)
    exact = weights.double().sum(0).numpy()
    half_ulp = 0.5 * float(torch.finfo(dtype).eps) * np.abs(exact) * (1 + 1e-5)

    out = model(x)
    (out.float() * weights.float()).sum().backward()
    converted = torch_bridge.convert(model, (x,), train=True)

    def loss(params):
        (y, _) = converted.apply(params, converted.buffers, torch_bridge.to_jax(x))
        return jnp.sum(y.astype(jnp.float32) * torch_bridge.to_jax(weights).astype(jnp.float32))

    grads = jax.jit(jax.grad(loss))(converted.params)
    for name in ("fc.bias", "shift", "bn.bias"):
        want = getattr(model, name.split(".")[0]) if name == "shift" else model.get_submodule(
            name.split(".")[0]).bias
        assert np.all(np.abs(want.grad.double().numpy() - exact) <= half_ulp), name  # torch
        got = np.asarray(grads[name], np.float64)
        assert np.all(np.abs(got - exact) <= half_ulp), (name, got, exact)


# ---- softmax and log-softmax in half precision -----------------------------------------
# torch's kernels compute a half-precision softmax in float32 and round once; the
# log-softmax over the last dimension also rounds its log-sum-exp term to the half dtype
# before subtracting it (CPU), and both backwards compute in float32 from the rounded
# output. In the half dtype itself, as jax.nn computes it, the bridge was up to 2 units
# in the last place off torch's outputs in 23% of them, and 12 units off its gradients.
# What is left is each side's float32 arithmetic: XLA's exp against torch's vectorized one
# (a few float32 units apart), and the order of the float32 sums. Either can move a result
# across a rounding boundary of the half dtype, one unit in its last place. A gradient
# carries that unit of its output y too (dx = y * (g - s), s = sum(g * y), for softmax;
# g - exp(y) * s, s = sum(g), for log-softmax), and where it cancels, the float32 error of
# the sum s: at most n * 2**-24 * sum(|terms|) over n terms.
def _half_ulp(values: np.ndarray, dtype) -> np.ndarray:
    """The spacing of ``dtype`` at each of ``values`` (float32 arrays)."""
    mantissa = {torch.bfloat16: 7, torch.float16: 10}[dtype]
    tiny = float(torch.finfo(dtype).tiny)
    exponent = np.floor(np.log2(np.maximum(np.abs(values), tiny)))
    return np.exp2(exponent - mantissa)


class _Softmax(torch.nn.Module):
    def __init__(self, function: str, dim: int):
        super().__init__()
        self.function, self.dim = function, dim

    def forward(self, x):
        return getattr(torch, self.function)(x, self.dim)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("function", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim,shape", [(-1, (64, 3000)), (0, (3000, 16)), (1, (4, 500, 7))])
def test_softmax_of_half_values_is_torchs(dtype, function, dim, shape):
    torch.manual_seed(0)
    x = (torch.randn(*shape) * 4).to(dtype).requires_grad_(True)
    grad = torch.randn(*shape).to(dtype)

    module = _Softmax(function, dim)
    out = module(x)
    out.backward(grad)
    converted = torch_bridge.convert(module, (x.detach(),), train=True)
    # jitted, as in a step: XLA must not skip the half-precision roundings in it
    got, vjp = jax.vjp(jax.jit(lambda a: converted.apply({}, {}, a)[0]),
                       torch_bridge.to_jax(x.detach()))
    (got_grad,) = vjp(torch_bridge.to_jax(grad))
    # dx = y * (g - sum(g * y)) (softmax), g - exp(y) * sum(g) (log-softmax)
    y, g = out.detach().float().numpy(), grad.float().numpy()
    weight, terms = (y, g * y) if function == "softmax" else (np.exp(y), g)
    total = np.sum(terms, axis=dim, keepdims=True)
    sum_error = x.shape[dim] * 2.0**-24 * np.sum(np.abs(terms), axis=dim, keepdims=True)
    # the change of dx per unit of y, times y's unit
    slope = np.abs(g - total) if function == "softmax" else np.exp(y) * np.abs(total)
    output_unit = slope * _half_ulp(y, dtype)
    for name, want, have in (("output", out.detach(), got), ("gradient", x.grad, got_grad)):
        assert have.dtype == torch_bridge.to_jax(want).dtype, name
        want = want.float().numpy()
        have = np.asarray(have, np.float32)
        off = np.abs(have - want)
        bound = _half_ulp(want, dtype)
        if name == "gradient":
            bound = bound + weight * sum_error + output_unit
        worst = np.unravel_index(np.argmax(off - bound), off.shape)
        assert np.all(off <= bound), (name, off[worst], want[worst], have[worst])
        assert np.mean(off > 0) <= 0.01, (name, np.mean(off > 0))  # a boundary, rarely
