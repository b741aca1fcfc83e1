"""Runs a cerebrax optimizer and its torch.optim counterpart on the same gradients.

The cerebrax side is a traced step whose loss ``sum(p * g)`` has exactly the gradient
``g``, so both optimizers consume identical gradients and any difference is the
optimizer's own. Parameters are handed to both optimizers in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import torch
from helpers import rel_err

import cerebrax as cstorch

SHAPES = {"a.weight": (5, 3), "a.bias": (3,), "b.weight": (3, 2)}


def initial(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}


def gradients(steps: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """Random gradients whose scale varies by three orders of magnitude between steps."""
    rng = np.random.default_rng(seed)
    return [{k: (rng.normal(size=s) * 10.0 ** rng.uniform(-3, 0)).astype(np.float32)
             for k, s in SHAPES.items()} for _ in range(steps)]


class GivenGradients:
    """A compiled model whose loss ``sum(p * g)`` has exactly the gradient ``g``."""

    def __init__(self, init: dict[str, np.ndarray]):
        def apply(params, grads):
            return sum(jnp.sum(params[k] * grads[k]) for k in SHAPES)

        self.model = cstorch.compile(cstorch.FunctionalModel(apply, init), "CPU")
        self.params = dict(self.model.named_parameters())
        # torch's parameter order (dict params are flattened in sorted key order).
        self.ordered = [self.params[k] for k in SHAPES]

    def state(self) -> dict[str, np.ndarray]:
        return self.model.state_dict()


def torch_params(init: dict[str, np.ndarray]) -> dict[str, torch.nn.Parameter]:
    return {k: torch.nn.Parameter(torch.tensor(v)) for k, v in init.items()}


def torch_step(optimizer: torch.optim.Optimizer, params: dict, grads: dict) -> None:
    for k, p in params.items():
        p.grad = torch.tensor(grads[k])
    optimizer.step()


def make_step(model: cstorch.CompiledModel, optimizer, scheduler=None) -> cstorch.TracedStep:
    @cstorch.trace
    def step(grads):
        loss = model(grads)
        cstorch.backward(loss)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return loss

    return step


GroupsFn = Callable[[dict[str, Any]], list]


def run_both(
    ours_cls: type, torch_cls: type, kwargs: dict, steps: int, groups: GroupsFn | None = None,
):
    """Runs both optimizers ``steps`` times; returns (ours, theirs) objects for inspection.

    ``groups(params_by_name)`` builds param-group dicts; by default one group of all
    parameters in ``SHAPES`` order.
    """
    init, grads = initial(), gradients(steps)
    ours = GivenGradients(init)
    theirs = torch_params(init)
    ours_params = groups(ours.params) if groups else ours.ordered
    theirs_params = groups(theirs) if groups else list(theirs.values())
    optimizer = ours_cls(ours_params, **kwargs)
    torch_optimizer = torch_cls(theirs_params, **kwargs)
    step = make_step(ours.model, optimizer)
    for g in grads:
        step(g)
        torch_step(torch_optimizer, theirs, g)
    return (ours, optimizer, step), (theirs, torch_optimizer)


def max_param_error(ours: GivenGradients, theirs: dict) -> float:
    state = ours.state()
    return max(rel_err(state[k], p.detach().numpy()) for k, p in theirs.items())


def max_state_error(optimizer, torch_optimizer) -> float:
    """Compares the torch-layout optimizer state dicts entry by entry."""
    mine, want = optimizer.state_dict(), torch_optimizer.state_dict()
    assert sorted(mine["state"]) == sorted(want["state"])
    worst = 0.0
    for i, entry in want["state"].items():
        assert sorted(mine["state"][i]) == sorted(entry), (i, sorted(mine["state"][i]))
        for key, value in entry.items():
            value = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
            worst = max(worst, rel_err(mine["state"][i][key], value))
    return worst
