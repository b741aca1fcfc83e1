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
