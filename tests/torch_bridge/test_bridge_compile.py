"""cstorch.compile(torch_module): the bridge behind cerebrax's ModelAdapter seam."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn as nn
from bridge_zoo import CNN, GPT, MLP, rel_err, seeded

import cerebrax as cstorch
import torch_bridge


class _Net(nn.Module):
    """An MLP with BatchNorm: parameters, buffers and a train-mode update."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)


def test_compiled_torch_module_trains_one_sgd_step_like_torch():
    cstorch.reset()
    module = seeded(_Net)
    reference = copy.deepcopy(module)
    x, y = _batch()

    compiled = cstorch.compile(module, "CPU")
    optimizer = cstorch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch_bridge.convert(nn.CrossEntropyLoss())

    @cstorch.trace
    def training_step(x, y):
        loss = loss_fn(compiled(x), y)
        cstorch.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    loss = training_step(jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))

    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    torch_loss = nn.CrossEntropyLoss()(reference(x), y)
    torch_loss.backward()
    torch_optimizer.step()

    assert rel_err(loss, torch_loss.item()) <= 1e-5
    state = compiled.state_dict()
    expected = reference.state_dict()
    assert list(state) == list(expected)  # torch's state_dict order
    for name, value in expected.items():
        assert rel_err(state[name], value.numpy()) <= 1e-5, name
    assert state["bn.num_batches_tracked"] == 1


def test_eval_mode_uses_running_statistics():
    cstorch.reset()
    module = seeded(_Net)
    reference = copy.deepcopy(module).eval()
    compiled = cstorch.compile(module, "CPU")
    compiled.eval()
    x, _ = _batch(1)
    out = compiled(jnp.asarray(x.numpy()))
    np.testing.assert_allclose(out, reference(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_optimizer_accepts_the_original_parameters_of_a_tied_model():
    cstorch.reset()
    module = seeded(GPT)
    compiled = cstorch.compile(module, "CPU")
    names = [n for n, _ in compiled.named_parameters()]
    assert "lm_head.weight" not in names and "wte.weight" in names
    optimizer = cstorch.optim.SGD(module.parameters(), lr=0.1)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(names)

    # The alias name resolves to the stored parameter too.
    aliases = cstorch.models.torch_model_adapter(module).parameter_aliases()
    assert aliases[module.lm_head.weight] == "wte.weight"


def test_every_torch_model_gets_a_key_seeded_from_torch():
    # Random ops are known only after the export, at the first call inside a step:
    # every torch model owns a key, whatever its source shows.
    for module in (seeded(MLP), seeded(CNN, p=0.0), seeded(CNN, p=0.5)):
        assert cstorch.models.torch_model_adapter(module).needs_key
    adapter = cstorch.models.torch_model_adapter(seeded(MLP))
    torch.manual_seed(5)
    first = jax.random.key_data(adapter.initial_key())
    torch.manual_seed(5)
    assert np.array_equal(first, jax.random.key_data(adapter.initial_key()))
    torch.manual_seed(6)
    assert not np.array_equal(first, jax.random.key_data(adapter.initial_key()))


def test_dropout_model_gets_a_fresh_mask_every_step():
    cstorch.reset()
    module = nn.Sequential(nn.Linear(16, 64), nn.Dropout(0.5))
    compiled = cstorch.compile(module, "CPU")

    @cstorch.trace
    def step(x):
        return compiled(x)

    x = jnp.ones((4, 16))
    a, b = np.asarray(step(x)), np.asarray(step(x))
    assert (a == 0).any() and not np.array_equal(a == 0, b == 0)
