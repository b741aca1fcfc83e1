"""Model zoo: outputs, parameter gradients and buffers match torch eager, train and eval."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import pytest
import torch
import torch._decomp
from bridge_zoo import (
    CNN,
    GPT,
    MLP,
    Encoder,
    Recurrent,
    ResNet,
    UNet,
    assert_parity,
    images,
    nn,
    seeded,
)


def _tokens():
    return torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))


ZOO = {
    "mlp": (lambda: seeded(MLP), lambda: (torch.randn(8, 16),)),
    "cnn": (lambda: seeded(CNN), lambda: (images(),)),
    "resnet": (lambda: seeded(ResNet), lambda: (images(),)),
    "gpt": (lambda: seeded(GPT), lambda: (_tokens(),)),
    "transformer_encoder": (lambda: seeded(Encoder), lambda: (torch.randn(2, 6, 32),)),
    "unet": (lambda: seeded(UNet), lambda: (images(size=8),)),
}


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_matches_torch(name, train):
    make_model, make_inputs = ZOO[name]
    torch.manual_seed(0)
    assert_parity(make_model(), make_inputs(), train=train)


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU], ids=["lstm", "gru"])
def test_recurrent_T200_matches_torch_and_stays_a_loop(cell):
    """Sequence length 200 stays a lax.scan in forward and gradient (core decomposition
    would unroll 200 steps)."""
    model = seeded(Recurrent, cell, bidirectional=cell is nn.GRU)
    x = torch.randn(2, 200, 8, generator=torch.Generator().manual_seed(0))
    for train in (False, True):
        conv = assert_parity(model, (x,), train=train)
    assert conv.programs[0].ops.count(str(torch.ops.aten.lstm.input)) <= 1
    assert len(conv.programs[0].nodes) < 40  # not unrolled
    # The shape-only kernel the export uses for recurrent ops is torch's own again.
    for op in (torch.ops.aten.lstm.input, torch.ops.aten.gru.input):
        assert torch._decomp.decomposition_table[op].__module__ == "torch._decomp.decompositions"

    # Forward and gradient stay loops: a handful of scans, not 200 unrolled time steps
    # (an unrolled sequence is thousands of equations, and ~18 s to compile).
    grad = jax.grad(lambda p, x: conv.apply(p, conv.buffers, x)[0].sum())
    eqns = jax.make_jaxpr(grad)(conv.params, jnp.ones((4, 200, 8))).jaxpr.eqns
    assert any(e.primitive.name == "scan" for e in eqns)
    assert len(eqns) < 200, len(eqns)
