"""Closed-form schedules and the LRScheduler classes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cerebrax as cstorch
from cerebrax import schedules

torch = pytest.importorskip("torch")


def _linear(init, end, total, t):
    return init + (end - init) * min(t, total) / total


def _cosine(init, end, total, t):
    return end + (init - end) * 0.5 * (1 + math.cos(math.pi * min(t, total) / total))


@pytest.mark.parametrize("t", [0, 1, 5, 9, 10, 11, 1000])
def test_closed_forms(t):
    assert float(schedules.linear(0.1, 0.01, 10)(t)) == pytest.approx(_linear(0.1, 0.01, 10, t))
    assert float(schedules.cosine_decay(0.1, 0.01, 10)(t)) == pytest.approx(
        _cosine(0.1, 0.01, 10, t), rel=1e-6)
    assert float(schedules.polynomial(1.0, 0.0, 10, power=2.0)(t)) == pytest.approx(
        (1 - min(t, 10) / 10) ** 2)
    assert float(schedules.constant(0.3)(t)) == pytest.approx(0.3)


def test_schedules_are_traceable_and_safe_at_huge_steps():
    fn = jax.jit(schedules.cosine_decay(1.0, 0.0, 100))
    assert float(fn(jnp.int32(2**31 - 1))) == pytest.approx(0.0, abs=1e-7)
    assert float(fn(jnp.int32(50))) == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize("factory, args, match", [
    (schedules.linear, (0.1, 0.0, 0), "total_iters must be an integer >= 1"),
    (schedules.cosine_decay, (0.1, "x", 10), "end_learning_rate must be a finite number"),
    (schedules.polynomial, (0.1, 0.0, 10, float("nan")), "power"),
])
def test_schedule_arguments_are_validated(factory, args, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        factory(*args)


def _torch_lambda_lrs(fn, steps):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, fn)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("cls, kwargs, reference", [
    ("LinearLR", dict(initial_learning_rate=0.1, end_learning_rate=0.01, total_iters=8),
     lambda t: _linear(0.1, 0.01, 8, t)),
    ("CosineDecayLR", dict(initial_learning_rate=0.1, end_learning_rate=0.0, total_iters=8),
     lambda t: _cosine(0.1, 0.0, 8, t)),
    ("ConstantLR", dict(learning_rate=0.05), lambda t: 0.05),
    ("PolynomialLR", dict(initial_learning_rate=0.1, end_learning_rate=0.0, total_iters=8,
                          power=2.0), lambda t: 0.1 * (1 - min(t, 8) / 8) ** 2),
])
def test_scheduler_drives_the_traced_step_like_torch(cls, kwargs, reference):
    model = cstorch.compile(cstorch.FunctionalModel(lambda p, x: (p["w"] * x).sum(),
                                                    {"w": jnp.zeros(1)}), "CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = getattr(cstorch.optim.lr_scheduler, cls)(optimizer, **kwargs)
    lrs = []

    @cstorch.step_closure
    def record(lr):
        lrs.append(float(lr))

    @cstorch.trace
    def step(x):
        loss = model(x)
        cstorch.backward(loss)
        optimizer.step()
        record(optimizer.param_groups[0]["lr"])
        scheduler.step()
        return loss

    for _ in range(12):
        step(jnp.ones(1))
    expected = _torch_lambda_lrs(reference, 12)
    np.testing.assert_allclose(lrs, expected, rtol=1e-6)
    # SGD with gradient 1: w = -sum(lr_t)
    np.testing.assert_allclose(model.state_dict()["w"], [-sum(expected)], rtol=1e-6)
    assert scheduler.get_last_lr() == pytest.approx([reference(12)])
    assert int(scheduler.last_epoch) == 12
    assert step.num_compiles == 1


def test_scheduler_state_dict_round_trip():
    model = cstorch.compile(cstorch.FunctionalModel(lambda p, x: (p["w"] * x).sum(),
                                                    {"w": jnp.zeros(1)}), "CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = cstorch.optim.lr_scheduler.LinearLR(optimizer, 0.1, 0.0, total_iters=10)
    for _ in range(3):
        scheduler.step()
    state = scheduler.state_dict()
    assert state["last_epoch"] == 3 and state["_last_lr"] == pytest.approx([0.07])
    other = cstorch.optim.lr_scheduler.LinearLR(optimizer, 0.1, 0.0, total_iters=10)
    assert other.get_last_lr() == pytest.approx([0.1])
    other.load_state_dict(state)
    assert other.get_last_lr() == pytest.approx([0.07])


def test_scheduler_needs_a_cerebrax_optimizer():
    p = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(cstorch.ConfigError, match="torch.optim optimizers cannot be scheduled"):
        cstorch.optim.lr_scheduler.LinearLR(torch.optim.SGD([p], lr=1.0), 0.1, 0.0, 10)


def test_custom_scheduler_closed_form():
    class Halving(cstorch.optim.lr_scheduler.LRScheduler):
        def _get_closed_form_lr(self):
            return 0.8 * 0.5 ** self.last_epoch.astype(jnp.float32)

    model = cstorch.compile(cstorch.FunctionalModel(lambda p, x: (p["w"] * x).sum(),
                                                    {"w": jnp.zeros(1)}), "CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = Halving(optimizer)

    @cstorch.trace
    def step(x):
        loss = model(x)
        cstorch.backward(loss)
        optimizer.step()
        scheduler.step()
        return loss

    for _ in range(3):
        step(jnp.ones(1))
    np.testing.assert_allclose(model.state_dict()["w"], [-(0.8 + 0.4 + 0.2)], rtol=1e-6)
    assert scheduler.get_last_lr() == pytest.approx([0.1])
