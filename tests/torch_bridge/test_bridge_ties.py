"""Gradients at the kinks of ReLU, ReLU6, Hardtanh and clamp are torch's.

At a tie (x exactly at a bound) ``jnp.maximum`` / ``jnp.clip`` split the gradient (0.5);
torch gives ReLU 0 at 0 and Hardtanh/ReLU6 0 at their bounds. clamp's rule at ties and at
NaN changed in torch 2.14 (torch_bridge/ops/minmax.py): the bridge follows the installed
torch, checked here on every combination of x, min and max in {-1, 0, 1, NaN}. Real
networks meet exact zeros (a BatchNorm initialised to weight 0 before a ReLU), so the
bridge takes torch's rule.
"""

from __future__ import annotations

import itertools

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


GRID = np.array(list(itertools.product([-1.0, 0.0, 1.0, np.nan], repeat=3)), np.float32).T


class ClampTensors(torch.nn.Module):
    def forward(self, x, low, high):
        return x.clamp(low, high)


class ClampScalars(torch.nn.Module):
    def __init__(self, low, high):
        super().__init__()
        self.low, self.high = low, high

    def forward(self, x):
        return x.clamp(self.low, self.high)


class Binary(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x, bound):
        return self.op(x, bound)


BINARY = {
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "fmax": torch.fmax,
    "fmin": torch.fmin,
    "clamp_min": torch.clamp_min,
    "clamp_max": torch.clamp_max,
    "clamp(min=)": lambda x, b: x.clamp(min=b),
    "clamp(max=)": lambda x, b: x.clamp(max=b),
}


def _check_against_torch(module, *values):
    """The bridge's value and every input's gradient equal torch eager's, NaN for NaN."""
    converted = torch_bridge.convert(module)
    inputs = [jnp.asarray(v) for v in values]
    out = converted.apply({}, {}, *inputs)[0]
    grads = jax.grad(
        lambda *a: converted.apply({}, {}, *a)[0].sum(), tuple(range(len(inputs))))(*inputs)
    tensors = [torch.tensor(v, requires_grad=True) for v in values]
    expected = module(*tensors)
    expected.sum().backward()
    np.testing.assert_array_equal(np.asarray(out), expected.detach().numpy())
    for got, tensor in zip(grads, tensors):
        np.testing.assert_array_equal(np.asarray(got), tensor.grad.numpy())


def test_clamp_with_tensor_bounds_on_every_tie_and_nan():
    _check_against_torch(ClampTensors(), *GRID)


def test_clamp_with_broadcast_tensor_bounds():
    x = GRID[0].reshape(16, 4)
    _check_against_torch(ClampTensors(), x, np.float32([[0.0], [1.0]] * 8), np.float32([1.0] * 4))


@pytest.mark.parametrize("name", BINARY)
def test_binary_min_max_and_one_sided_clamp_on_every_tie_and_nan(name):
    _check_against_torch(Binary(BINARY[name]), GRID[0], GRID[1])


def test_an_integer_operand_takes_no_gradient_and_the_float_one_torch_s():
    converted = torch_bridge.convert(Binary(torch.maximum))
    x, y = jnp.asarray([-1, 0, 1]), jnp.asarray([0.0, 0.0, 0.0])
    grad = jax.grad(lambda b: converted.apply({}, {}, x, b)[0].sum())(y)
    ty = torch.zeros(3, requires_grad=True)
    torch.maximum(torch.tensor([-1, 0, 1]), ty).sum().backward()
    np.testing.assert_array_equal(np.asarray(grad), ty.grad.numpy())


@pytest.mark.parametrize(
    "low, high", [(0.0, 1.0), (0.0, None), (None, 0.0), (1.0, 0.0), (0.0, 0.0), (-1.0, np.nan)])
def test_clamp_with_scalar_bounds_on_every_tie_and_nan(low, high):
    _check_against_torch(ClampScalars(low, high), GRID[0])


def test_nan_passes_through():
    converted = torch_bridge.convert(torch.nn.ReLU())
    out = converted.apply({}, {}, jnp.asarray([np.nan, -1.0]))[0]
    assert np.isnan(np.asarray(out)[0]) and np.asarray(out)[1] == 0.0
