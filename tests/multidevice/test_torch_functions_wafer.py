"""Custom autograd Functions and backward hooks on the emulated wafer's layouts.

A torch model whose identical blocks each apply a custom ``torch.autograd.Function``
(a clamp with a straight-through backward, with a Python argument), and whose head has a
full backward hook, trains in the weight-streaming and pipeline layouts as on one
device (fp32, rel 1e-5); weight streaming still runs the blocks as one loop (the
Function's graph node is the same in every block). Run in its own process:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/multidevice
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import fresh_backend, rel_err, xent

import cerebrax as cstorch

STEPS = 5
BLOCKS = 4
LAYOUTS = {
    "ws8": dict(execution_mode="weight_streaming", max_wgt_servers=8),
    # micro-batches with rematerialization: the Function's forward runs again
    "ws8_micro8": dict(execution_mode="weight_streaming", max_wgt_servers=8,
                       micro_batch_size=8),
    "pipe4": dict(execution_mode="pipeline", num_stages=4, micro_batch_size=8),
}


class ClampThrough(torch.autograd.Function):
    """Clamps to ``[-limit, limit]``; the gradient passes everywhere (straight through)."""

    @staticmethod
    def forward(ctx, x, limit):
        return torch.clamp(x, -limit, limit)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.tanh(ClampThrough.apply(self.fc(x), 0.5))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(BLOCKS)])
        self.head = torch.nn.Linear(16, 4)
        self.head.register_full_backward_hook(lambda m, grad_in, grad_out: (grad_in[0] * 2,))

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _train(layout: str | None):
    backend = fresh_backend(LAYOUTS.get(layout))
    torch.manual_seed(0)
    model = cstorch.compile(Net(), backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @cstorch.trace
    def step(x, y):
        loss = xent(model(x), y)
        cstorch.backward(loss)
        optimizer.step()
        return loss

    data = np.random.default_rng(2)
    batches = [(data.normal(size=(32, 8)).astype(np.float32),
                data.integers(0, 4, 32).astype(np.int32)) for _ in range(STEPS)]
    losses = np.array([float(step(x, y)) for x, y in batches])
    return losses, model.state_dict(), step, batches[0]


@pytest.fixture(autouse=True)
def _clean():
    yield
    cstorch.reset()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_functions_and_hooks_train_like_one_device(layout):
    ref_losses, ref_state, _, _ = _train(None)
    losses, state, step, (x, y) = _train(layout)
    assert rel_err(losses, ref_losses) <= 1e-5, (losses, ref_losses)
    for name in ref_state:
        assert rel_err(state[name], ref_state[name]) <= 1e-5, name
    if layout.startswith("ws8"):
        loops = [loop for loop in cstorch.wse.collective_report(step, x, y).loops
                 if loop.count("all-gather")]
        assert sorted(loop.trip_count for loop in loops) == [BLOCKS, BLOCKS], loops
