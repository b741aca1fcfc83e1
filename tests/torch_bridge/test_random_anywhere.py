"""Random ops anywhere in a torch model get keys: stochastic depth in timm and torchvision
trains in a traced step with no setup, fresh every step and reproducible from
``torch.manual_seed``.

A compiled torch model owns a PRNG key, split on every call; each random op of the
exported graph draws from its own split. The masks cannot equal torch's (torch draws
from its own generator): the tests check torch's semantics instead (every row of a
stochastic-depth output is 0 or torch's ``x / (1 - p)``), that masks change from step
to step and between two random ops of one graph, and that the same seed repeats them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cerebrax as cstorch

from vision import load

torchvision, timm = load()
ROWS, P, STEPS = 8, 0.5, 6


class TwoDrops(torch.nn.Module):
    """Two stochastic-depth ops (torchvision's function and timm's module) on one input."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))
        self.timm_drop = timm.layers.DropPath(P)

    def forward(self, x):
        x = x * self.scale
        a = torchvision.ops.stochastic_depth(x, P, "row", training=self.training)
        return a, self.timm_drop(x)


def run_two_drops(seed, steps=STEPS):
    torch.manual_seed(seed)
    module = TwoDrops()
    compiled = cstorch.compile(module, "CPU")
    optimizer = cstorch.optim.SGD(module.parameters(), lr=0.0)

    @cstorch.trace
    def step(x):
        a, b = compiled(x)
        (a.sum() + b.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
        return a, b

    x = torch.arange(1.0, 1.0 + ROWS * 4).reshape(ROWS, 4)
    outs = [tuple(np.asarray(t) for t in step(x)) for _ in range(steps)]
    assert step.num_compiles == 1
    return x, outs


def test_stochastic_depth_masks_follow_torch_and_change_every_step():
    x, outs = run_two_drops(seed=0)
    with torch.no_grad():  # torch's kept rows: x / (1 - p)
        kept = (x / (1 - P)).numpy()
    masks = []
    for a, b in outs:
        for out in (a, b):
            dropped = np.all(out == 0, axis=1)
            np.testing.assert_allclose(out[~dropped], kept[~dropped], rtol=1e-6)
        masks.append((np.all(a == 0, axis=1), np.all(b == 0, axis=1)))
    firsts = {m[0].tobytes() for m in masks}
    assert len(firsts) > 1, "the same mask on every step"
    assert any(not np.array_equal(ma, mb) for ma, mb in masks), "both ops drew one mask"
    kept_fraction = 1 - np.mean([m for pair in masks for m in pair])
    assert 0.25 < kept_fraction < 0.75  # p = 0.5 over 96 rows


def test_masks_repeat_for_the_same_seed_and_differ_for_another():
    _, first = run_two_drops(seed=7, steps=3)
    cstorch.reset()
    _, again = run_two_drops(seed=7, steps=3)
    for (a1, b1), (a2, b2) in zip(first, again):
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(b1, b2)
    cstorch.reset()
    _, other = run_two_drops(seed=8, steps=3)
    assert any(not np.array_equal(a1, a2) for (a1, _), (a2, _) in zip(first, other))


def test_eval_mode_has_no_random_ops():
    torch.manual_seed(0)
    module = TwoDrops().eval()
    compiled = cstorch.compile(module, "CPU")
    x = torch.ones(ROWS, 4)
    a, b = compiled(x)
    np.testing.assert_array_equal(np.asarray(a), x.numpy())
    np.testing.assert_array_equal(np.asarray(b), x.numpy())


def active_drops(model):
    """torch's stochastic-depth modules that draw a mask in train mode."""
    found = 0
    for m in model.modules():
        if isinstance(m, torchvision.ops.StochasticDepth) and m.p > 0:
            found += 1
        elif isinstance(m, timm.layers.DropPath) and m.drop_prob > 0:
            found += 1
    return found


def resnet50():
    return timm.create_model("resnet50", drop_path_rate=0.1, num_classes=10)


def convnext_tiny():
    return torchvision.models.convnext_tiny(num_classes=10)


@pytest.mark.parametrize("build", [resnet50, convnext_tiny], ids=["timm-resnet50",
                                                                  "torchvision-convnext"])
def test_library_model_with_stochastic_depth_trains_with_no_setup(build):
    torch.manual_seed(0)
    model = build().train()
    compiled = cstorch.compile(model, "CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    @cstorch.trace
    def step(x, y):
        loss = loss_fn(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])
    losses = [float(step(x, y)) for _ in range(3)]
    assert np.all(np.isfinite(losses))
    assert step.num_compiles == 1
    (program,) = compiled._adapter.converted.programs
    # One random op per stochastic-depth module torch runs, each with its own key.
    assert len(program.random_nodes) == active_drops(model) > 10
    assert {str(n.target) for n in program.random_nodes} <= {"aten.bernoulli.p",
                                                             "aten.bernoulli.default"}
