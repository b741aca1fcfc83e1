"""SGD and AdamW against torch.optim: same gradients in, same parameters and state out."""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import rel_err

import cerebrax as cstorch

torch = pytest.importorskip("torch")
from optim_harness import (  # noqa: E402
    SHAPES,
    GivenGradients,
    gradients,
    initial,
    make_step,
    torch_params,
    torch_step,
)

STEPS = 20

@pytest.mark.parametrize("cls, kwargs", [("SGD", {"lr": 0.05, "momentum": 0.9}),
                                         ("AdamW", {"lr": 1e-2}),
                                         ("AdamW", {"lr": 1e-2, "amsgrad": True})])
def test_torch_state_dict_saved_mid_run_continues_the_torch_run(cls, kwargs, tmp_path):
    """torch trains 15 steps and saves; cerebrax loads and trains 15 more, like torch."""
    init, grads = initial(), gradients(30)
    tparams = torch_params(init)
    topt = getattr(torch.optim, cls)(list(tparams.values()), **kwargs)
    for g in grads[:15]:
        torch_step(topt, tparams, g)
    torch.save({"model": {k: v.detach() for k, v in tparams.items()},
                "optimizer": topt.state_dict()}, tmp_path / "torch_step15.pt")
    saved = torch.load(tmp_path / "torch_step15.pt")
    ours = GivenGradients(init)
    ours.model.load_state_dict(saved["model"])
    optimizer = getattr(cstorch.optim, cls)(ours.ordered, **kwargs)
    optimizer.load_state_dict(saved["optimizer"])
    step = make_step(ours.model, optimizer)
    for g in grads[15:]:
        step(g)
        torch_step(topt, tparams, g)
    state = ours.model.state_dict()
    for k, tp in tparams.items():
        assert rel_err(state[k], tp.detach().numpy()) <= 1e-5, k


def test_learning_rate_change_between_steps_needs_no_recompile():
    init, grads = initial(), gradients(4)
    ours = GivenGradients(init)
    optimizer = cstorch.optim.SGD(ours.ordered, lr=0.1)
    step = make_step(ours.model, optimizer)
    tparams = torch_params(init)
    topt = torch.optim.SGD(list(tparams.values()), lr=0.1)
    for i, g in enumerate(grads):
        optimizer.param_groups[0]["lr"] = 0.1 / (i + 1)
        topt.param_groups[0]["lr"] = 0.1 / (i + 1)
        step(g)
        torch_step(topt, tparams, g)
    assert step.num_compiles == 1
    for k, tp in tparams.items():
        assert rel_err(ours.model.state_dict()[k], tp.detach().numpy()) <= 1e-6


@pytest.mark.parametrize(
    "cls, kwargs, match",
    [("SGD", {"lr": -1.0}, "Invalid learning rate"),
     ("SGD", {"lr": 0.1, "nesterov": True}, "Nesterov momentum requires"),
     ("SGD", {"lr": 0.1, "differentiable": True}, "differentiable"),
     ("AdamW", {"betas": (1.0, 0.9)}, "Invalid beta parameter at index 0"),
     ("AdamW", {"eps": -1.0}, "Invalid epsilon"),
     ("AdamW", {"weight_decay": -0.1}, "Invalid weight_decay")],
)
def test_invalid_hyperparameters(cls, kwargs, match):
    ours = GivenGradients(initial())
    with pytest.raises(cstorch.ConfigError, match=match):
        getattr(cstorch.optim, cls)(ours.ordered, **kwargs)


def test_optimizer_rejects_foreign_parameters():
    with pytest.raises(cstorch.ConfigError, match="compiled_model.parameters"):
        cstorch.optim.SGD([jnp.ones(3)], lr=0.1)


def test_parameter_in_two_groups_is_refused():
    ours = GivenGradients(initial())
    p = ours.params["a.bias"]
    with pytest.raises(cstorch.ConfigError, match="more than one parameter group"):
        cstorch.optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)


def test_graph_hyperparameter_cannot_change_after_the_first_step():
    ours = GivenGradients(initial())
    optimizer = cstorch.optim.AdamW(ours.model.parameters())
    make_step(ours.model, optimizer)(gradients(1)[0])
    with pytest.raises(cstorch.StateError, match="part of the compiled step"):
        optimizer.param_groups[0]["betas"] = (0.5, 0.5)


def test_custom_optimizer_state_only_from_preinitialize():
    class Signum(cstorch.optim.Optimizer):
        def __init__(self, params, lr=0.01):
            super().__init__(params, {"lr": lr})

        def preinitialize(self):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["sign_sum"] = jnp.zeros(p.shape)

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["sign_sum"] = self.state[p]["sign_sum"] + jnp.sign(p.grad)
                    p.value = p.value - group["lr"] * jnp.sign(p.grad)

    init, grads = initial(), gradients(3)
    ours = GivenGradients(init)
    optimizer = Signum(ours.model.parameters(), lr=0.1)
    step = make_step(ours.model, optimizer)
    for g in grads:
        step(g)
    want = {k: init[k] - 0.1 * sum(np.sign(g[k]) for g in grads) for k in SHAPES}
    chex.assert_trees_all_close(ours.model.state_dict(), want, rtol=1e-6)

    class Leaky(Signum):
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["late"] = p.grad

    ours = GivenGradients(init)
    leaky = Leaky(ours.model.parameters())
    with pytest.raises(cstorch.StateError, match="outside preinitialize"):
        make_step(ours.model, leaky)(grads[0])
