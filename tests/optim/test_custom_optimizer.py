"""The custom Optimizer API: preinitialize, step, enable_global_step, misuse errors."""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from optim_harness import SHAPES, GivenGradients, gradients, initial, make_step

import cerebrax as cstorch


class MomentumSign(cstorch.optim.Optimizer):
    """sign-SGD with momentum and a per-parameter global step (a cstorch-style optimizer)."""

    def __init__(self, params, lr=0.01, beta=0.9):
        super().__init__(params, {"lr": lr, "beta": beta}, enable_global_step=True)

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["momentum"] = jnp.zeros(p.shape)

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                m = group["beta"] * state["momentum"] + (1 - group["beta"]) * p.grad
                state["momentum"] = m
                self.increment_global_step(p)
                p.value = p.value - group["lr"] * jnp.sign(m)

    def state_names_to_sparsify(self):
        return ["momentum"]


def test_custom_optimizer_matches_its_formula():
    init, grads = initial(), gradients(10)
    ours = GivenGradients(init)
    optimizer = MomentumSign(ours.ordered, lr=0.05, beta=0.8)
    step = make_step(ours.model, optimizer)
    for g in grads:
        step(g)
    for k in SHAPES:
        p = init[k].astype(np.float64)
        m = np.zeros_like(p)
        for g in grads:
            m = 0.8 * m + 0.2 * g[k]
            p = p - 0.05 * np.sign(m)
        np.testing.assert_allclose(ours.state()[k], p, rtol=1e-5, atol=1e-6)
        assert float(optimizer.state[ours.params[k]]["step"]) == 10.0
    assert optimizer.state_names_to_sparsify() == ["momentum"]
    assert step.num_compiles == 1


def test_learning_rate_of_a_custom_optimizer_is_state():
    init, grads = initial(), gradients(3)
    ours = GivenGradients(init)
    optimizer = MomentumSign(ours.ordered, lr=0.05)
    step = make_step(ours.model, optimizer)
    step(grads[0])
    optimizer.param_groups[0]["lr"] = 0.0
    before = ours.state()
    step(grads[1])
    chex.assert_trees_all_equal(ours.state(), before)
    assert step.num_compiles == 1


def test_python_branch_on_a_tensor_in_step_raises():
    class Branchy(MomentumSign):
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if jnp.sum(p.grad) > 0:
                        p.value = p.value - group["lr"]

    ours = GivenGradients(initial())
    step = make_step(ours.model, Branchy(ours.ordered))
    with pytest.raises(cstorch.TensorReadError, match="step_closure"):
        step(gradients(1)[0])


def test_global_step_needs_enable_global_step():
    class NoStep(MomentumSign):
        def __init__(self, params):
            cstorch.optim.Optimizer.__init__(self, params, {"lr": 0.1, "beta": 0.5})

        def step(self, closure=None):
            for p in self.param_groups[0]["params"]:
                self.increment_global_step(p)

    ours = GivenGradients(initial())
    step = make_step(ours.model, NoStep(ours.ordered))
    with pytest.raises(cstorch.StateError, match="No global step in the state"):
        step(gradients(1)[0])


def test_abstract_methods_are_required():
    class Incomplete(cstorch.optim.Optimizer):
        def preinitialize(self):
            pass

    ours = GivenGradients(initial())
    with pytest.raises(TypeError, match="abstract"):
        Incomplete(ours.ordered, {"lr": 0.1})


def test_custom_optimizer_state_dict_saves_loads_and_continues(tmp_path):
    """Trains 4 steps, saves with cstorch.save, then a fresh optimizer loads the file and
    runs 4 more: the result is the uninterrupted 8-step run's, bit for bit."""
    init, grads = initial(), gradients(8)
    ours = GivenGradients(init)
    groups = [{"params": ours.ordered[:2], "lr": 0.03}, {"params": ours.ordered[2:]}]
    optimizer = MomentumSign(groups, lr=0.05, beta=0.8)
    step = make_step(ours.model, optimizer)
    for g in grads[:4]:
        step(g)
    optimizer.param_groups[1]["beta"] = 0.7  # a hyperparameter changed mid-run is saved too
    state = optimizer.state_dict()
    assert sorted(state["state"]) == [0, 1, 2]
    assert sorted(state["state"][0]) == ["momentum", "step"] and state["state"][0]["step"] == 4
    assert state["param_groups"] == [{"lr": 0.03, "beta": 0.8, "params": [0, 1]},
                                     {"lr": 0.05, "beta": 0.7, "params": [2]}]
    cstorch.save({"model": ours.model.state_dict(), "optimizer": state}, tmp_path / "c.h5")
    for g in grads[4:]:
        step(g)
    uninterrupted = ours.state()
    momentum = np.asarray(optimizer.state[ours.params["b.weight"]]["momentum"])

    cstorch.reset()
    saved = cstorch.load(tmp_path / "c.h5")
    resumed = GivenGradients(init)
    resumed.model.load_state_dict(saved["model"])
    fresh = MomentumSign([{"params": resumed.ordered[:2], "lr": 0.03},
                          {"params": resumed.ordered[2:]}], lr=0.05, beta=0.8)
    fresh.load_state_dict(saved["optimizer"])
    assert fresh.param_groups[1]["beta"] == 0.7
    step = make_step(resumed.model, fresh)
    for g in grads[4:]:
        step(g)
    chex.assert_trees_all_equal(resumed.state(), uninterrupted)
    np.testing.assert_array_equal(fresh.state[resumed.params["b.weight"]]["momentum"], momentum)
    assert float(fresh.state[resumed.params["a.bias"]]["step"]) == 8.0


def test_custom_optimizer_load_state_dict_names_what_is_missing():
    ours = GivenGradients(initial())
    optimizer = MomentumSign(ours.ordered)
    state = optimizer.state_dict()
    del state["state"][1]["momentum"]
    with pytest.raises(cstorch.StateError, match="'a.bias'.*lacks 'momentum'"):
        MomentumSign(ours.ordered).load_state_dict(state)
    state = optimizer.state_dict()
    state["state"][2]["momentum"] = np.zeros((7,))
    with pytest.raises(cstorch.StateError, match=r"shape \(7,\), expected \(3, 2\)"):
        MomentumSign(ours.ordered).load_state_dict(state)
    with pytest.raises(cstorch.StateError, match="doesn't match the size"):
        MomentumSign([{"params": ours.ordered[:1]}, {"params": ours.ordered[1:]}]).load_state_dict(
            {"state": {}, "param_groups": [{"params": [0, 1]}, {"params": [2]}]})
