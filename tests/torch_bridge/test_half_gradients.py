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
