"""The Optimizer base's zero-grad hooks and ``visit_state`` / ``apply``, against torch."""

from __future__ import annotations

import copy

import numpy as np
import torch

import cerebrax as cstorch


def _data(n: int):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)) for _ in range(n)]


def test_zero_grad_hooks_run_around_zero_grad_and_can_be_removed():
    model = torch.nn.Linear(4, 2)
    compiled = cstorch.compile(model, "CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    pre = optimizer.register_zero_grad_pre_hook(
        lambda opt, args, kwargs: calls.append(("pre", opt is optimizer, dict(kwargs))))
    optimizer.register_zero_grad_post_hook(lambda opt, args, kwargs: calls.append(("post",)))

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    (x, y), = _data(1)
    step(x, y)
    assert calls == [("pre", True, {"set_to_none": True}), ("post",)]
    pre.remove()
    optimizer.zero_grad()
    assert calls[-1] == ("post",) and len(calls) == 3


def test_visit_state_rewrites_the_state_like_editing_torchs():
    """Zeroing SGD's momentum buffers mid-run with visit_state trains like zeroing
    torch's ``momentum_buffer`` by hand."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    compiled = cstorch.compile(model, "CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    for i, (x, y) in enumerate(_data(5)):
        if i == 3:
            optimizer.visit_state(lambda value: value * 0)
            optimizer.apply(lambda value: None)  # None keeps the value
            for state in ref_opt.state.values():
                state["momentum_buffer"].zero_()
        step(x, y)
        loss = torch.nn.functional.mse_loss(reference(x), y)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(np.asarray(value), reference.state_dict()[name].numpy(),
                                   rtol=1e-6, atol=1e-7)
