"""Half-precision products on the CPU are rounded before the sums that use them.

torch eager rounds every float16 / bfloat16 operation. XLA's CPU compiler lets LLVM fuse
a product and the addition that consumes it into one FMA instruction; where the CPU
has half-precision arithmetic (AVX-512 FP16) that rounds ``a * b + c`` once, and 23% of
random float16 elements differ from torch's (``tools/half_arith_probe.py`` on a Xeon
with AVX-512 FP16). The bridge's ``mul`` keeps each product apart behind an optimization
barrier, forward and backward. On a CPU without half arithmetic, nothing fuses, and the
numeric tests here pass either way: the structural test says the barrier is there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_bridge

HALF = [torch.float16, torch.bfloat16]


class Rotary(torch.nn.Module):
    """Products summed, as a rotary embedding sums them (each operand used twice, so
    that the gradients are sums of products too)."""

    def forward(self, x, cos, sin):
        return x * cos + x.flip(-1) * sin - cos * sin


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(64, 32, generator=g).to(dtype) for _ in range(3))


@pytest.mark.parametrize("dtype", HALF)
def test_sums_of_half_products_are_torchs_forward_and_backward(dtype):
    args = _inputs(dtype)
    leaves = [a.clone().requires_grad_() for a in args]
    out = Rotary()(*leaves)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    (out * weight).sum().backward()

    converted = torch_bridge.convert(Rotary(), args)
    jargs = tuple(map(torch_bridge.to_jax, args))
    jweight = torch_bridge.to_jax(weight)

    def loss(*a):
        y = converted.apply({}, {}, *a)[0]
        return jnp.sum((y * jweight).astype(jnp.float32)), y

    grads, got = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(*jargs)
    np.testing.assert_array_equal(np.asarray(got, np.float32), out.detach().float().numpy())
    for g, leaf in zip(grads, leaves):
        np.testing.assert_array_equal(np.asarray(g, np.float32), leaf.grad.float().numpy())


@pytest.mark.parametrize("dtype, barred", [(torch.float16, True), (torch.bfloat16, True),
                                           (torch.float32, False)])
def test_on_the_cpu_each_half_product_stands_behind_a_barrier(dtype, barred):
    """The program of a half step holds an optimization barrier for every product of
    the forward and of the backward; a float32 program holds none (XLA fuses it freely,
    and float32 is compared with a tolerance)."""
    args = tuple(map(torch_bridge.to_jax, _inputs(dtype)))
    converted = torch_bridge.convert(Rotary(), _inputs(dtype))

    def loss(*a):
        return jnp.sum(converted.apply({}, {}, *a)[0].astype(jnp.float32))

    with torch_bridge.lowering_platform("cpu"):
        text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(*args))
    barriers = text.count("optimization_barrier")
    assert (barriers >= 3 + 3) if barred else (barriers == 0), text


def test_a_gpu_program_keeps_its_products_fusable():
    args = tuple(map(torch_bridge.to_jax, _inputs(torch.bfloat16)))
    converted = torch_bridge.convert(Rotary(), _inputs(torch.bfloat16))
    with torch_bridge.lowering_platform("gpu"):
        text = str(jax.make_jaxpr(lambda *a: converted.apply({}, {}, *a)[0])(*args))
    assert "optimization_barrier" not in text
