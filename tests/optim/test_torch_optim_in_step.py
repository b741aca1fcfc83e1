"""torch optimizers and schedulers converted for a traced step (cerebrax.optim._torch_in_step).

The table of torch schedulers cerebrax maps to closed forms, each checked against torch's
own scheduler step by step (two param groups with their own base rates); the schedulers
it refuses, with their reasons; and ``from_torch``'s handling of torch's options. The
training runs against torch eager are in tests/conformance/test_torch_optim.py.
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch

import cerebrax as cstorch
from cerebrax.optim import _torch_in_step
from cerebrax.optim._from_torch import HARMLESS_OPTIONS, TORCH_EQUIVALENTS

L = torch.optim.lr_scheduler
STEPS = 12
GROUP_LRS = (0.1, 0.02)


def _optimizer(params: list, **kwargs) -> torch.optim.Optimizer:
    return torch.optim.SGD([{"params": [params[0]], "lr": GROUP_LRS[0]},
                            {"params": [params[1]], "lr": GROUP_LRS[1]}], lr=0.1, **kwargs)


def _converted(make_sched, **kwargs):
    """A torch SGD with two groups over a compiled module, its scheduler, converted."""
    module = torch.nn.Linear(2, 2)
    cstorch.compile(module, "CPU")
    opt = _optimizer([module.weight, module.bias], **kwargs)
    sched = make_sched(opt)
    opt._opt_called = True  # what torch's step sets: a traced step converts in a step
    _torch_in_step.convert(opt)
    return opt, sched


def _reference(make_sched, **kwargs):
    opt = _optimizer([torch.nn.Parameter(torch.zeros(1)) for _ in range(2)], **kwargs)
    sched = make_sched(opt)
    opt.step()  # no gradients: only marks the optimizer stepped, as torch's schedulers expect
    return opt, sched


def _rates(opt) -> list[float]:
    return [float(g["lr"]) for g in opt.param_groups]


MAPPED = {
    "StepLR": lambda o: L.StepLR(o, 3, 0.5),
    "MultiStepLR": lambda o: L.MultiStepLR(o, [2, 5, 5, 9], 0.3),
    "ExponentialLR": lambda o: L.ExponentialLR(o, 0.9),
    "CosineAnnealingLR": lambda o: L.CosineAnnealingLR(o, T_max=4, eta_min=0.001),
    "LinearLR": lambda o: L.LinearLR(o, 0.25, 1.0, total_iters=5),
    "ConstantLR": lambda o: L.ConstantLR(o, 0.5, total_iters=3),
    "PolynomialLR": lambda o: L.PolynomialLR(o, total_iters=6, power=2.0),
    "LambdaLR": lambda o: L.LambdaLR(o, [lambda e: 0.95 ** e, lambda e: 1 / (e + 1)]),
    "CosineAnnealingWarmRestarts": lambda o: L.CosineAnnealingWarmRestarts(o, 3, 2, 0.001),
    "CyclicLR": lambda o: L.CyclicLR(o, [0.01, 0.002], [0.1, 0.05], 3, 2, mode="triangular2",
                                     cycle_momentum=False),
    "CyclicLR-exp_range": lambda o: L.CyclicLR(o, 0.01, 0.1, 2, mode="exp_range", gamma=0.9,
                                               cycle_momentum=False),
    "OneCycleLR": lambda o: L.OneCycleLR(o, [0.5, 0.2], total_steps=STEPS, pct_start=0.3,
                                         cycle_momentum=False),
    "OneCycleLR-three-phase": lambda o: L.OneCycleLR(
        o, 0.5, total_steps=STEPS, three_phase=True, anneal_strategy="linear",
        cycle_momentum=False),
    "SequentialLR": lambda o: L.SequentialLR(o, [
        L.LinearLR(o, 0.1, 1.0, total_iters=3), L.CosineAnnealingLR(o, T_max=6)], [3]),
    "ChainedScheduler": lambda o: L.ChainedScheduler([
        L.ConstantLR(o, 0.5, total_iters=2), L.ExponentialLR(o, 0.9)]),
}


@pytest.mark.parametrize("name", list(MAPPED))
def test_a_mapped_scheduler_gives_torchs_rates_step_by_step(name):
    """Converted, the torch scheduler is its closed form per param group (each from its
    own base rate): the rates, ``get_last_lr()`` and ``last_epoch`` of every step equal
    torch's (float32: rel 1e-6)."""
    opt, sched = _converted(MAPPED[name])
    assert vars(sched)["_cerebrax"].kind == "converted", vars(sched)["_cerebrax"].plan.reason
    want_opt, want_sched = _reference(MAPPED[name])
    for step in range(STEPS):
        np.testing.assert_allclose(_rates(opt), _rates(want_opt), rtol=1e-6, atol=1e-9,
                                   err_msg=f"step {step}")
        np.testing.assert_allclose(sched.get_last_lr(), want_sched.get_last_lr(), rtol=1e-6,
                                   atol=1e-9)
        if step < STEPS - 1:  # OneCycleLR stops at total_steps
            sched.step()
            want_sched.step()
    assert sched.last_epoch == getattr(want_sched, "last_epoch", STEPS - 1)
    assert isinstance(sched, type(want_sched))


def test_a_converted_scheduler_starts_where_torch_left_it():
    """A scheduler stepped (or loaded) before its conversion continues from its
    ``last_epoch``."""
    def make_sched(o):
        sched = L.StepLR(o, 2, 0.5)
        for _ in range(3):
            o.step()
            sched.step()
        return sched

    opt, sched = _converted(make_sched)
    assert sched.last_epoch == 3
    np.testing.assert_allclose(_rates(opt), [0.05, 0.01], rtol=1e-6)
    sched.step()
    np.testing.assert_allclose(_rates(opt), [0.025, 0.005], rtol=1e-6)


def _warm_restarts_off_its_closed_form(o):
    sched = L.CosineAnnealingWarmRestarts(o, 3)
    sched.step(1.5)  # a fractional epoch: T_cur leaves the closed form of last_epoch
    return sched


REFUSED = {
    "ReduceLROnPlateau": (lambda o: L.ReduceLROnPlateau(o), "value of a metric"),
    "MultiplicativeLR": (lambda o: L.MultiplicativeLR(o, lambda e: 0.9),
                         "no closed form for MultiplicativeLR"),
    "LambdaLR-python-branch": (lambda o: L.LambdaLR(o, lambda e: min(1.0, (e + 1) / 3)),
                               "cannot be evaluated on an int32 step"),
    "CyclicLR-momentum": (lambda o: L.CyclicLR(o, 0.01, 0.1, 3), "cycles the momentum"),
    "subclass": (lambda o: type("MyStepLR", (L.StepLR,), {})(o, 2),
                 "no closed form for .*MyStepLR"),
    "off-its-closed-form": (_warm_restarts_off_its_closed_form,
                            "at step 1 torch gives param group 0 the rate"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_scheduler_without_a_closed_form_is_refused_in_the_step(name):
    """A scheduler cerebrax cannot write as a closed form gets a reason, refuses to step
    inside a traced step (the error names it and the fix), and outside one steps as
    torch does, writing the converted optimizer's rates."""
    make_sched, reason = REFUSED[name]
    opt, sched = _converted(make_sched, momentum=0.9)
    link = vars(sched)["_cerebrax"]
    assert link.kind == "refused"
    assert re.search(reason, link.plan.reason), link.plan.reason
    error = _torch_in_step.refusal(type(sched).__name__, link.plan.reason)
    assert "step it outside the traced step" in str(error)
    if name != "ReduceLROnPlateau":
        want_opt, want_sched = _reference(make_sched, momentum=0.9)
        for _ in range(3):
            sched.step()
            want_sched.step()
            np.testing.assert_allclose(_rates(opt), _rates(want_opt), rtol=1e-6)


def test_two_schedulers_on_one_optimizer_are_refused_in_the_step():
    """torch combines two schedulers of one optimizer step by step: no closed form."""
    both = []
    opt, sched = _converted(lambda o: both.extend([L.StepLR(o, 2), L.ExponentialLR(o, 0.9)])
                            or both[0])
    for sched in both:
        assert vars(sched)["_cerebrax"].kind == "refused"
        assert "2 torch schedulers" in vars(sched)["_cerebrax"].plan.reason


def test_a_scheduler_created_after_the_conversion_is_refused_where_it_would_differ():
    """A second torch scheduler over a converted optimizer whose rate is a closed form
    is refused when it writes the rate (its constructor does)."""
    opt, _ = _converted(lambda o: L.StepLR(o, 2))
    with pytest.raises(cstorch.ConfigError, match="ChainedScheduler"):
        L.ExponentialLR(opt, 0.9)


def test_a_scheduler_created_after_the_conversion_refuses_to_step_in_a_traced_step():
    module = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(module, "CPU")
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    late = []

    @cstorch.trace
    def step(x):
        compiled(x).sum().backward()
        opt.step()
        for sched in late:
            sched.step()

    step(torch.ones(3, 2))
    late.append(L.ExponentialLR(opt, 0.9))  # outside a step, no closed-form scheduler: torch's
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)

    @cstorch.trace
    def second_step(x):
        return step.__wrapped__(x)

    with pytest.raises(cstorch.ConfigError, match="created after the optimizer's first"):
        second_step(torch.ones(3, 2))


# ---- the optimizer facade and from_torch -------------------------------------------------
def test_the_facade_speaks_torch():
    """A converted torch optimizer keeps its class, its torch parameters and torch's
    group keys; ``from_torch`` of it is the converted optimizer; its groups are fixed."""
    opt, sched = _converted(lambda o: L.StepLR(o, 2))
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    assert isinstance(opt.param_groups[0]["params"][0], torch.nn.Parameter)
    want_opt, _ = _reference(lambda o: L.StepLR(o, 2))
    assert list(opt.param_groups[0]) == list(want_opt.param_groups[0])
    assert opt.param_groups[0]["initial_lr"] == 0.1
    assert cstorch.optim.from_torch(opt) is vars(opt)["_cerebrax"].optimizer
    opt.param_groups[1]["momentum"] = 0.5  # a new value is state of the converted optimizer
    assert vars(opt)["_cerebrax"].optimizer.param_groups[1]["momentum"] == 0.5
    with pytest.raises(cstorch.ConfigError, match="StepLR computes"):
        opt.param_groups[1]["lr"] = 0.5  # torch would scale it from here on: refused
    with pytest.raises(cstorch.StateError, match="Add every group before the first call"):
        opt.add_param_group({"params": []})
    with pytest.raises(cstorch.ConfigError, match=r"step\(epoch\) is not supported"):
        sched.step(3)


def test_from_torch_builds_each_group_with_its_own_options():
    """A group's own momentum (a construction-time choice in cerebrax) is its own, not
    the optimizer's default (it once came from the defaults: no momentum at all)."""
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    cstorch.compile(module, "CPU")
    torch_sgd = torch.optim.SGD([{"params": module[0].parameters(), "momentum": 0.9},
                                 {"params": module[1].parameters()}], lr=0.1)
    converted = cstorch.optim.from_torch(torch_sgd)
    assert [g["momentum"] for g in converted.param_groups] == [0.9, 0.0]
    uses = [converted._factory_arguments(g)["use_momentum"] for g in converted.param_groups]
    assert uses == [True, False]


@pytest.mark.parametrize("name", TORCH_EQUIVALENTS)
def test_every_torch_argument_is_taken_or_harmless(name):
    """Each argument of torch's constructor is one the cerebrax class takes, or one that
    chooses an implementation only: nothing torch uses is dropped."""
    torch_args = set(inspect.signature(getattr(torch.optim, name)).parameters) - {"params"}
    ours = set(inspect.signature(getattr(cstorch.optim, name)).parameters)
    harmless = {k for k, only in HARMLESS_OPTIONS.items() if only in (None, name)}
    assert torch_args - ours <= harmless, torch_args - ours - harmless


def test_from_torch_refuses_an_option_it_does_not_honour():
    module = torch.nn.Linear(3, 2)
    cstorch.compile(module, "CPU")
    torch_sgd = torch.optim.SGD(module.parameters(), lr=0.1)
    torch_sgd.defaults["ema_decay"] = 0.99  # as a future torch option might be
    with pytest.raises(cstorch.ConfigError, match="ema_decay=0.99"):
        cstorch.optim.from_torch(torch_sgd)
