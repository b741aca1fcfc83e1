"""``cstorch.optim.from_torch``: a torch optimizer's cerebrax equivalent, state included."""

from __future__ import annotations

import copy

import chex
import numpy as np
import pytest
import torch

import cerebrax as cstorch


def _trained_torch_optimizer(cls, **kwargs):
    """A torch optimizer with two param groups after three steps on fixed gradients."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    cstorch.compile(module, "CPU")
    optimizer = cls([{"params": module[0].parameters(), "lr": 0.05},
                     {"params": module[1].parameters()}], **kwargs)
    for _ in range(3):
        for p in module.parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()
    return optimizer


@pytest.mark.parametrize("cls, kwargs", [
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (torch.optim.AdamW, dict(lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)),
    (torch.optim.RMSprop, dict(lr=1e-2, alpha=0.9, centered=True)),
])
def test_class_groups_and_state_carry_over(cls, kwargs):
    source = _trained_torch_optimizer(cls, **kwargs)
    converted = cstorch.optim.from_torch(source)
    assert type(converted) is getattr(cstorch.optim, cls.__name__)
    want, got = source.state_dict(), converted.state_dict()
    for g_want, g_got in zip(want["param_groups"], got["param_groups"]):
        for key in ("lr", "weight_decay"):
            np.testing.assert_allclose(float(g_got[key]), g_want[key], rtol=1e-6)
    assert want["state"].keys() == got["state"].keys()
    want_state = {i: {k: v.numpy() for k, v in entries.items()}
                  for i, entries in want["state"].items()}
    got_state = {i: {k: np.asarray(got["state"][i][k]) for k in entries}
                 for i, entries in want_state.items()}
    chex.assert_trees_all_close(got_state, want_state, rtol=1e-6)


def test_optimizers_without_a_cerebrax_equivalent_are_refused():
    module = torch.nn.Linear(3, 2)
    with pytest.raises(cstorch.ConfigError, match="LBFGS"):
        cstorch.optim.from_torch(torch.optim.LBFGS(module.parameters()))
    with pytest.raises(cstorch.ConfigError, match="Fix: build the cerebrax optimizer"):
        cstorch.optim.from_torch(object())


_TORCH_DEFAULT_BUILT = ["ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax",
                        "NAdam", "RAdam", "RMSprop", "Rprop", "SGD"]


@pytest.mark.parametrize("name", _TORCH_DEFAULT_BUILT)
def test_torch_defaults_carry_over_not_cstorchs(name):
    """A torch optimizer built on torch's defaults keeps them (eps=1e-8, not cstorch's
    1e-6), exactly as torch holds them, and the converted one trains like torch."""
    assert set(_TORCH_DEFAULT_BUILT) == set(cstorch.optim._from_torch.TORCH_EQUIVALENTS)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    reference = copy.deepcopy(module)
    compiled = cstorch.compile(module, "CPU")
    converted = cstorch.optim.from_torch(getattr(torch.optim, name)(module.parameters()))
    theirs = getattr(torch.optim, name)(reference.parameters())
    want = theirs.state_dict()["param_groups"][0]
    got = converted.state_dict()["param_groups"][0]
    for key, value in want.items():
        if key in got and key != "params":
            assert got[key] == value and type(got[key]) is type(value), (key, got[key], value)

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        loss.backward()
        converted.step()
        converted.zero_grad()
        return loss

    data = torch.randn(5, 4, 3, generator=torch.Generator().manual_seed(1))
    for x in data:
        step(x)
        theirs.zero_grad()
        reference(x).square().mean().backward()
        theirs.step()
    for (key, value), ref in zip(module.state_dict().items(), reference.state_dict().values()):
        np.testing.assert_allclose(np.asarray(value), ref.numpy(), rtol=1e-5, atol=1e-7,
                                   err_msg=key)
