"""The weight-decay schedulers: every one against its float64 closed form inside a traced
step, the scheduled value in the update (AdamW against torch's AdamW with its group's
weight decay set by hand), composites, and the learning-rate schedulers alongside."""

from __future__ import annotations

import inspect

import jax.numpy as jnp
import numpy as np
import pytest
from optim_harness import GivenGradients, gradients, initial, make_step, max_param_error
from schedule_cases import CASES, REFERENCES, assert_lrs

import cerebrax as cstorch

torch = pytest.importorskip("torch")

WDS = cstorch.optim.weight_decay_scheduler
LRS = cstorch.optim.lr_scheduler

# cstorch's weight-decay argument names for the learning-rate schedulers' ones.
RENAMED = {"learning_rate": "val", "initial_learning_rate": "initial_val",
           "end_learning_rate": "end_val", "learning_rates": "vals", "base_lr": "base_val",
           "max_lr": "max_val", "lr_lambda": "wd_lambda"}


def wd_class(lr_class: str) -> str:
    return lr_class[:-2] + "WD" if lr_class.endswith("LR") else lr_class + "WD"


def as_wd(kwargs: dict) -> dict:
    return {RENAMED.get(k, k): v for k, v in kwargs.items()}


def test_the_whole_family_exists_with_the_lr_schedulers_arguments():
    names = ["ConstantWD", "PolynomialWD", "LinearWD", "ExponentialWD",
             "InverseExponentialTimeDecayWD", "InverseSquareRootDecayWD", "CosineDecayWD",
             "SequentialWD", "PiecewiseConstantWD", "MultiStepWD", "StepWD",
             "CosineAnnealingWD", "LambdaWD", "CosineAnnealingWarmRestartsWD",
             "MultiplicativeWD", "ChainedWD", "CyclicWD", "OneCycleWD", "ScalePerParamWD"]
    pairs = {"ChainedWD": "ChainedScheduler", "CosineAnnealingWarmRestartsWD":
             "CosineAnnealingWarmRestarts"}
    for name in names:
        wd, lr = getattr(WDS, name), getattr(LRS, pairs.get(name, name[:-2] + "LR"))
        got = [(p.name, p.default) for p in inspect.signature(wd).parameters.values()]
        want = [(RENAMED.get(p.name, p.name), p.default)
                for p in inspect.signature(lr).parameters.values()]
        assert got == want, name
        assert wd.param_group_key == "weight_decay" and issubclass(wd, lr)


def _decaying_model():
    """A parameter w = 1 with a zero gradient: SGD(lr=1) makes it prod(1 - wd_t)."""
    return cstorch.compile(cstorch.FunctionalModel(lambda p, x: (p["w"] * x).sum(),
                                                   {"w": jnp.ones(1)}), "CPU")


def _run(model, optimizer, schedulers, steps):
    """Traced SGD steps on a zero gradient; returns the weight decay each step used."""
    used = []

    @cstorch.step_closure
    def record(wd):
        used.append(float(wd))

    @cstorch.trace
    def step(x):
        loss = model(x)
        cstorch.backward(loss)
        optimizer.step()
        record(optimizer.param_groups[0]["weight_decay"])
        for scheduler in schedulers:
            scheduler.step()
        return loss

    for _ in range(steps):
        step(jnp.zeros(1))
    return np.asarray(used), step


@pytest.mark.parametrize("case", CASES)
def test_every_schedule_writes_its_closed_form_into_the_update(case):
    cls, arguments = CASES[case]
    kwargs = arguments(40)
    model = _decaying_model()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = getattr(WDS, wd_class(cls))(optimizer, **as_wd(kwargs))
    used, step = _run(model, optimizer, [scheduler], 40)
    expected = REFERENCES[cls](np.arange(41.0), **kwargs)
    assert_lrs(used, expected[:40])
    assert_lrs(model.state_dict()["w"], [np.prod(1.0 - expected[:40])], rtol=1e-5)
    assert_lrs(scheduler.get_last_value(), [expected[40]])
    assert optimizer.param_groups[0]["lr"] == 1.0  # the learning rate is left alone
    assert scheduler.state_dict()["last_epoch"] == 40
    assert step.num_compiles == 1


def test_adamw_uses_the_scheduled_weight_decay_like_torch():
    init, grads = initial(), gradients(25)
    ours = GivenGradients(init)
    optimizer = cstorch.optim.AdamW(ours.ordered, lr=1e-2, eps=1e-8, weight_decay=0.3)
    scheduler = WDS.CosineDecayWD(optimizer, initial_val=0.5, end_val=0.01, total_iters=20)
    step = make_step(ours.model, optimizer, scheduler)
    theirs = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in init.items()}
    constant = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in init.items()}
    topt = torch.optim.AdamW(list(theirs.values()), lr=1e-2, eps=1e-8)
    topt_constant = torch.optim.AdamW(list(constant.values()), lr=1e-2, eps=1e-8,
                                      weight_decay=0.3)
    closed_form = REFERENCES["CosineDecayLR"](np.arange(25.0), 0.5, 0.01, 20)
    for t, g in enumerate(grads):
        step(g)
        topt.param_groups[0]["weight_decay"] = float(closed_form[t])
        for params, opt in ((theirs, topt), (constant, topt_constant)):
            for k, p in params.items():
                p.grad = torch.tensor(g[k])
            opt.step()
    assert max_param_error(ours, theirs) <= 1e-5
    assert max_param_error(ours, constant) > 1e-3  # the schedule made the difference
    assert step.num_compiles == 1


def test_composites_and_the_lr_scheduler_alongside():
    model = _decaying_model()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0, weight_decay=0.0)
    wd = WDS.SequentialWD(optimizer, [
        WDS.LinearWD(optimizer, 0.0, 0.1, total_iters=5),
        WDS.ChainedWD([WDS.ConstantWD(optimizer, 0.1),
                       WDS.ExponentialWD(optimizer, 1.0, total_iters=1, decay_rate=0.9)]),
    ], milestones=[5])
    lr = LRS.StepLR(optimizer, 1.0, step_size=4, gamma=0.5)
    used, step = _run(model, optimizer, [wd, lr], 12)
    t = np.arange(13.0)
    wd_t = np.where(t < 5, 0.1 * t / 5, 0.1 * 0.9 ** np.maximum(t - 5, 0))
    lr_t = 0.5 ** np.floor(t / 4)
    assert_lrs(used, wd_t[:12])
    assert_lrs(model.state_dict()["w"], [np.prod(1.0 - lr_t[:12] * wd_t[:12])], rtol=1e-5)
    assert_lrs(lr.get_last_lr(), [lr_t[12]])
    assert_lrs(wd.get_last_value(), [wd_t[12]])
    assert "_last_value" in wd.state_dict() and "_last_lr" in lr.state_dict()
    assert step.num_compiles == 1


def test_lambda_wd_and_its_state_dict_round_trip():
    model = _decaying_model()
    optimizer = cstorch.optim.AdamW(model.parameters())
    scheduler = WDS.LambdaWD(optimizer, 0.2, wd_lambda=lambda t: 1.0 / (1.0 + t))
    for _ in range(3):
        scheduler.step()
    state = scheduler.state_dict()
    assert state["last_epoch"] == 3
    assert_lrs(state["_last_value"], [0.05])
    other = WDS.LambdaWD(optimizer, 0.2, wd_lambda=lambda t: 1.0 / (1.0 + t))
    other.load_state_dict(state)
    assert_lrs(optimizer.param_groups[0]["weight_decay"], 0.05)


@pytest.mark.parametrize("make, match", [
    (lambda o: WDS.SequentialWD(o, [LRS.ConstantLR(o, 0.1), WDS.ConstantWD(o, 0.1)], [3]),
     r"SequentialWD writes 'weight_decay' but schedulers\[0\] \(ConstantLR\) writes 'lr'"),
    (lambda o: LRS.ChainedScheduler([LRS.ConstantLR(o, 0.1), WDS.ConstantWD(o, 0.1)]),
     "writes 'lr' but schedulers"),
    (lambda o: WDS.CosineAnnealingWarmRestartsWD(o, 0.1, T_0=4, T_mult=1.5), "T_mult"),
])
def test_errors(make, match):
    optimizer = cstorch.optim.SGD(_decaying_model().parameters(), lr=1.0)
    with pytest.raises(cstorch.ConfigError, match=match):
        make(optimizer)


def test_an_optimizer_without_weight_decay_is_refused():
    optimizer = cstorch.optim.Rprop(_decaying_model().parameters())
    with pytest.raises(cstorch.ConfigError, match="writes 'weight_decay'.*does not have"):
        WDS.ConstantWD(optimizer, 0.1)
