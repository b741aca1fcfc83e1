"""Gradients at the kinks of ReLU, ReLU6, Hardtanh and clamp are torch's.

At a tie (x exactly at a bound) ``jnp.maximum`` / ``jnp.clip`` split the gradient (0.5);
torch gives ReLU 0 at 0, Hardtanh/ReLU6 0 at their bounds and clamp 1 on its closed
interval. Real networks meet exact zeros (a BatchNorm initialised to weight 0 before a
ReLU), so the bridge takes torch's rule.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_bridge


class Clamp(torch.nn.Module):
    def forward(self, x):
        return x.clamp(0.0, 1.0)


class ClampBelow(torch.nn.Module):
    def forward(self, x, low):
        return x.clamp(min=low)


CASES = [
    (torch.nn.ReLU(), [-1.0, 0.0, 2.0]),
    (torch.nn.ReLU6(), [-1.0, 0.0, 2.0, 6.0, 7.0]),
    (torch.nn.Hardtanh(), [-2.0, -1.0, 0.0, 1.0, 2.0]),
    (Clamp(), [-1.0, 0.0, 0.5, 1.0, 2.0]),
]


@pytest.mark.parametrize("module, values", CASES, ids=lambda c: type(c).__name__)
def test_values_and_gradients_at_ties_are_torch_s(module, values):
    converted = torch_bridge.convert(module)
    x = jnp.asarray(values)
    out = converted.apply({}, {}, x)[0]
    grad = jax.grad(lambda v: converted.apply({}, {}, v)[0].sum())(x)
    t = torch.tensor(values, requires_grad=True)
    expected = module(t)
    expected.sum().backward()
    np.testing.assert_array_equal(np.asarray(out), expected.detach().numpy())
    np.testing.assert_array_equal(np.asarray(grad), t.grad.numpy())


def test_a_tensor_bound_gets_the_gradient_where_it_is_taken():
    converted = torch_bridge.convert(ClampBelow())
    x, low = jnp.asarray([-1.0, 0.0, 2.0]), jnp.asarray([0.0, 0.0, 0.0])
    gx, glow = jax.grad(lambda a, b: converted.apply({}, {}, a, b)[0].sum(), (0, 1))(x, low)
    tx = torch.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    tlow = torch.zeros(3, requires_grad=True)
    ClampBelow()(tx, tlow).sum().backward()
    np.testing.assert_array_equal(np.asarray(gx), tx.grad.numpy())
    np.testing.assert_array_equal(np.asarray(glow), tlow.grad.numpy())


def test_nan_passes_through():
    converted = torch_bridge.convert(torch.nn.ReLU())
    out = converted.apply({}, {}, jnp.asarray([np.nan, -1.0]))[0]
    assert np.isnan(np.asarray(out)[0]) and np.asarray(out)[1] == 0.0
