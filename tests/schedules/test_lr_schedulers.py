"""Every LR scheduler against a float64 NumPy closed form, against torch where torch
has the same schedule, at the int32 step limit, inside a traced step, and through
configure_lr_scheduler."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cerebrax as cstorch
from cerebrax import schedules

torch = pytest.importorskip("torch")
from schedule_cases import (  # noqa: E402
    CASES,
    FACTORIES,
    INT32_MAX,
    REFERENCES,
    assert_lrs,
    ref_polynomial,
)

T = torch.optim.lr_scheduler
LRS = cstorch.optim.lr_scheduler


@pytest.mark.parametrize("case", CASES)
def test_closed_form_matches_float64_reference(case):
    cls, arguments = CASES[case]
    kwargs = arguments(2000)
    t = np.arange(2000)
    got = jax.jit(FACTORIES[cls](**kwargs))(jnp.arange(2000))
    assert got.dtype == jnp.float32 and got.shape == (2000,)
    assert_lrs(got, REFERENCES[cls](t.astype(np.float64), **kwargs))


# Beyond its last phase the 1cycle cosine keeps oscillating (cstorch does not clamp);
# at |t| >> 2**24 float32 cannot resolve its phase, so there it is only bounded.
_BOUNDED_AT_INT32_MAX = {"one_cycle_cos", "one_cycle_three_phase"}


@pytest.mark.parametrize("case", CASES)
def test_closed_form_at_the_int32_step_limit(case):
    cls, arguments = CASES[case]
    kwargs = arguments(2000)
    got = float(jax.jit(FACTORIES[cls](**kwargs))(jnp.int32(INT32_MAX)))
    assert math.isfinite(got)
    if case in _BOUNDED_AT_INT32_MAX:
        assert 0.0 <= got <= kwargs["max_lr"]
    else:
        assert_lrs(got, REFERENCES[cls](np.float64(INT32_MAX), **kwargs))


def test_counter_saturates_at_the_int32_step_limit():
    model = _model()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = LRS.StepLR(optimizer, 0.1, step_size=1000, gamma=0.5)
    scheduler.load_state_dict({"last_epoch": INT32_MAX - 1})
    scheduler.step()
    scheduler.step()
    assert int(scheduler.last_epoch) == INT32_MAX
    assert math.isfinite(scheduler.get_last_lr()[0])


def test_composed_closed_forms():
    parts = [schedules.linear(0.0, 0.1, 100), schedules.cosine_decay(0.1, 0.001, 1400),
             schedules.constant(0.001)]
    t = np.arange(2000.0)
    expected = np.where(t < 100, ref_polynomial(t, 0.0, 0.1, 100),
                        np.where(t < 1500, REFERENCES["CosineDecayLR"](t - 100, 0.1, 0.001, 1400),
                                 0.001))
    assert_lrs(jax.jit(schedules.sequential(parts, [100, 1500]))(jnp.arange(2000)), expected)
    chain = schedules.chained([schedules.piecewise_constant([0.1, 0.05], [1000]),
                               schedules.exponential(2.0, 1, 0.999)])
    expected = np.where(t < 1000, 0.1, 0.05) * 0.999**t
    assert_lrs(jax.jit(chain)(jnp.arange(2000)), expected)
    assert math.isfinite(float(jax.jit(chain)(jnp.int32(INT32_MAX))))


# ---- torch's schedulers -----------------------------------------------------------------
def torch_lrs(make, steps, lr=0.1):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    lrs = []
    with warnings.catch_warnings():
        # SequentialLR steps its members with an epoch argument, which torch deprecates.
        warnings.simplefilter("ignore")
        sched = make(opt)
        for _ in range(steps):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
    return np.asarray(lrs)


# (torch scheduler on an optimizer with lr=0.1, the cerebrax schedule, steps). Where the
# parameterizations differ, the mapping is in the id.
TORCH_CASES = {
    "StepLR": (lambda o: T.StepLR(o, step_size=30, gamma=0.5),
               lambda: schedules.step_decay(0.1, 30, 0.5), 200),
    "StepLR=ExponentialLR(total_iters=step_size,staircase)": (
        lambda o: T.StepLR(o, step_size=30, gamma=0.5),
        lambda: schedules.exponential(0.1, 30, 0.5, staircase=True), 200),
    "MultiStepLR": (lambda o: T.MultiStepLR(o, [30, 80, 80, 150], gamma=0.1),
                    lambda: schedules.multi_step(0.1, 0.1, [30, 80, 80, 150]), 200),
    "ExponentialLR(gamma)=ExponentialLR(total_iters=1,decay_rate=gamma)": (
        lambda o: T.ExponentialLR(o, gamma=0.98),
        lambda: schedules.exponential(0.1, 1, 0.98), 300),
    "MultiplicativeLR(constant lambda)": (
        lambda o: T.MultiplicativeLR(o, lambda epoch: 0.98),
        lambda: schedules.multiplicative(0.1, 0.98), 300),
    "LambdaLR": (lambda o: T.LambdaLR(o, lambda epoch: 1 / (1 + 0.05 * epoch)),
                 lambda: schedules.lambda_schedule(0.1, lambda t: 1 / (1 + 0.05 * t)), 300),
    "LinearLR(factors)=LinearLR(lr*factors)": (
        lambda o: T.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=50),
        lambda: schedules.linear(0.01, 0.1, 50), 100),
    "ConstantLR(factor)=PiecewiseConstantLR": (
        lambda o: T.ConstantLR(o, factor=1 / 3, total_iters=5),
        lambda: schedules.piecewise_constant([0.1 / 3, 0.1], [5]), 20),
    "PolynomialLR=PolynomialLR(end=0)": (
        lambda o: T.PolynomialLR(o, total_iters=100, power=2.0),
        lambda: schedules.polynomial(0.1, 0.0, 100, 2.0), 150),
    "CosineAnnealingLR": (lambda o: T.CosineAnnealingLR(o, T_max=50, eta_min=0.001),
                          lambda: schedules.cosine_annealing(0.1, 50, 0.001), 300),
    "CosineAnnealingWarmRestarts": (
        lambda o: T.CosineAnnealingWarmRestarts(o, T_0=20, eta_min=0.001),
        lambda: schedules.cosine_annealing_warm_restarts(0.1, 20, 1, 0.001), 300),
    "CosineAnnealingWarmRestarts(T_mult=2)": (
        lambda o: T.CosineAnnealingWarmRestarts(o, T_0=10, T_mult=2),
        lambda: schedules.cosine_annealing_warm_restarts(0.1, 10, 2), 400),
    **{f"CyclicLR({mode})": (
        lambda o, mode=mode: T.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=20,
                                        step_size_down=10, mode=mode, gamma=0.99,
                                        cycle_momentum=False),
        lambda mode=mode: schedules.cyclic(0.01, 0.1, 20, 10, mode, 0.99), 200)
       for mode in ("triangular", "triangular2", "exp_range")},
    **{f"OneCycleLR({strategy},three_phase={three})=OneCycleLR(init=max_lr/div_factor)": (
        lambda o, s=strategy, three=three: T.OneCycleLR(
            o, max_lr=0.1, total_steps=200, pct_start=0.25 if three else 0.3,
            anneal_strategy=s, div_factor=25.0, final_div_factor=1e4, three_phase=three,
            cycle_momentum=False),
        lambda s=strategy, three=three: schedules.one_cycle(
            0.1 / 25.0, 0.1, 200, 0.25 if three else 0.3, 1e4, three, s), 200)
       for strategy in ("cos", "linear") for three in (False, True)},
    "SequentialLR": (
        lambda o: T.SequentialLR(o, [T.LinearLR(o, 0.1, 1.0, 10), T.ExponentialLR(o, 0.95)],
                                 milestones=[10]),
        lambda: schedules.sequential([schedules.linear(0.01, 0.1, 10),
                                      schedules.exponential(0.1, 1, 0.95)], [10]), 60),
    "ChainedScheduler": (
        lambda o: T.ChainedScheduler([T.ConstantLR(o, factor=0.5, total_iters=4),
                                      T.ExponentialLR(o, gamma=0.9)]),
        lambda: schedules.chained([schedules.piecewise_constant([0.05, 0.1], [4]),
                                   schedules.exponential(1.0, 1, 0.9)]), 40),
}


@pytest.mark.parametrize("case", TORCH_CASES)
def test_closed_form_matches_torch(case):
    make_torch, make_ours, steps = TORCH_CASES[case]
    assert_lrs(jax.jit(make_ours())(jnp.arange(steps)), torch_lrs(make_torch, steps))


# ---- the classes inside a traced step ------------------------------------------------------
def _model():
    return cstorch.compile(cstorch.FunctionalModel(lambda p, x: (p["w"] * x).sum(),
                                                   {"w": jnp.zeros(1)}), "CPU")


def _run_traced(model, optimizer, scheduler, steps):
    """Runs `steps` SGD steps (gradient 1) and returns the lr each step used."""
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

    for _ in range(steps):
        step(jnp.ones(1))
    return np.asarray(lrs), step


@pytest.mark.parametrize("case", CASES)
def test_scheduler_class_in_a_traced_step(case):
    cls, arguments = CASES[case]
    kwargs = arguments(40)
    model = _model()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = getattr(LRS, cls)(optimizer, **kwargs)
    lrs, step = _run_traced(model, optimizer, scheduler, 40)
    expected = REFERENCES[cls](np.arange(41.0), **kwargs)
    assert_lrs(lrs, expected[:40])
    assert_lrs(model.state_dict()["w"], [-expected[:40].sum()], atol=1e-7)
    assert_lrs(scheduler.get_last_lr(), [expected[40]])
    assert int(scheduler.last_epoch) == 40
    assert step.num_compiles == 1


def test_sequential_class_matches_torch():
    model = _model()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    warmup = LRS.LinearLR(optimizer, 0.01, 0.1, total_iters=10)
    decay = LRS.ExponentialLR(optimizer, 0.1, total_iters=1, decay_rate=0.95)
    # torch restarts each member from the optimizer's initial lr (0.1).
    anneal = LRS.CosineAnnealingLR(optimizer, 0.1, T_max=10)
    scheduler = LRS.SequentialLR(optimizer, [warmup, decay, anneal], milestones=[10, 25])
    lrs, step = _run_traced(model, optimizer, scheduler, 40)
    expected = torch_lrs(lambda o: T.SequentialLR(
        o, [T.LinearLR(o, 0.1, 1.0, 10), T.ExponentialLR(o, 0.95),
            T.CosineAnnealingLR(o, T_max=10)], milestones=[10, 25]), 40)
    assert_lrs(lrs, expected)
    assert step.num_compiles == 1
    assert int(decay.last_epoch) == 40 - 10 and int(anneal.last_epoch) == 40 - 25


def test_chained_class_matches_torch():
    model = _model()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = LRS.ChainedLR([
        LRS.PiecewiseConstantLR(optimizer, [0.05, 0.1], milestones=[4]),
        LRS.ExponentialLR(optimizer, 1.0, total_iters=1, decay_rate=0.9),
        LRS.StepLR(optimizer, 2.0, step_size=10, gamma=0.5)])
    lrs, step = _run_traced(model, optimizer, scheduler, 40)
    expected = torch_lrs(lambda o: T.ChainedScheduler([
        T.ConstantLR(o, factor=0.5, total_iters=4), T.ExponentialLR(o, gamma=0.9),
        T.StepLR(o, step_size=10, gamma=0.5)]), 40)
    assert_lrs(lrs, expected)
    assert step.num_compiles == 1


def test_changing_the_lr_or_stepping_schedulers_never_recompiles(compiles):
    model = _model()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = LRS.SequentialLR(optimizer, [
        LRS.LinearLR(optimizer, 0.0, 0.1, total_iters=5),
        LRS.ChainedScheduler([LRS.CosineDecayLR(optimizer, 0.1, 0.01, total_iters=10),
                              LRS.CyclicLR(optimizer, 1.0, 2.0, step_size_up=3)]),
    ], milestones=[5])
    _, step = _run_traced(model, optimizer, scheduler, 3)
    before = compiles.count
    optimizer.param_groups[0]["lr"] = 0.5  # used by the next optimizer step, then rescheduled
    w = float(model.state_dict()["w"][0])
    step(jnp.ones(1))
    assert float(model.state_dict()["w"][0]) == pytest.approx(w - 0.5)
    for _ in range(12):
        step(jnp.ones(1))
    assert step.num_compiles == 1
    assert compiles.count == before
    assert int(scheduler.last_epoch) == 16


# ---- composite behaviour, state dicts, errors ------------------------------------------------
def test_members_of_a_composite_cannot_be_stepped():
    optimizer = cstorch.optim.SGD(_model().parameters(), lr=1.0)
    member = LRS.LinearLR(optimizer, 0.1, 0.0, total_iters=10)
    LRS.SequentialLR(optimizer, [member, LRS.ConstantLR(optimizer, 0.01)], milestones=[10])
    with pytest.raises(cstorch.ConfigError, match="part of a SequentialLR"):
        member.step()
    with pytest.raises(cstorch.ConfigError, match="already belongs to a composite"):
        LRS.ChainedScheduler([member])


def test_composite_state_dict_round_trip():
    def build(optimizer):
        return LRS.SequentialLR(optimizer, [
            LRS.LinearLR(optimizer, 0.0, 0.1, total_iters=10),
            LRS.CosineDecayLR(optimizer, 0.1, 0.0, total_iters=20)], milestones=[10])

    optimizer = cstorch.optim.SGD(_model().parameters(), lr=1.0)
    scheduler = build(optimizer)
    for _ in range(15):
        scheduler.step()
    state = scheduler.state_dict()
    assert state["last_epoch"] == 15 and state["_milestones"] == [10]
    assert [s["last_epoch"] for s in state["_schedulers"]] == [15, 5]
    expected = REFERENCES["CosineDecayLR"](5.0, 0.1, 0.0, 20)
    assert_lrs(state["_last_lr"], [expected])
    other = build(optimizer)
    assert other.get_last_lr() == pytest.approx([0.0])
    other.load_state_dict(state)
    assert_lrs(other.get_last_lr(), [expected])


def test_custom_scheduler_inside_a_composite():
    class Halving(LRS.LRScheduler):
        initial_learning_rate = 1.0

        def _get_closed_form_lr(self):
            return 0.5 ** self.last_epoch.astype(jnp.float32)

    optimizer = cstorch.optim.SGD(_model().parameters(), lr=1.0)
    scheduler = LRS.SequentialLR(optimizer, [LRS.ConstantLR(optimizer, 0.3), Halving(optimizer)],
                                 milestones=[2])
    lrs = [scheduler.get_last_lr()[0]]
    for _ in range(4):
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    assert lrs == pytest.approx([0.3, 0.3, 1.0, 0.5, 0.25])


@pytest.mark.parametrize("make, match", [
    (lambda o: LRS.SequentialLR(o, [LRS.ConstantLR(o, 0.1)], milestones=[5]),
     "one milestone fewer than schedulers"),
    (lambda o: LRS.SequentialLR(o, [LRS.ConstantLR(o, 0.1), LRS.ConstantLR(o, 0.2)], [2.5]),
     "milestones must be a list of integer steps"),
    (lambda o: LRS.ChainedScheduler([LRS.ConstantLR(o, 0.1), LRS.ConstantLR(o, 0.0)]),
     r"schedulers\[1\] \(ConstantLR\) by its initial learning rate"),
    (lambda o: LRS.ChainedScheduler([]), "at least one scheduler"),
    (lambda o: LRS.StepLR(o, 0.1, step_size=0, gamma=0.5), "step_size must be an integer >= 1"),
    (lambda o: LRS.ExponentialLR(o, 0.1, 10, decay_rate=-0.5), "decay_rate must be >= 0"),
    (lambda o: LRS.CosineAnnealingWarmRestarts(o, 0.1, T_0=10, T_mult=1.5), "T_mult"),
    (lambda o: LRS.CyclicLR(o, 0.01, 0.1, mode="cosine"), "mode must be one of"),
    (lambda o: LRS.OneCycleLR(o, 0.01, 0.1, total_steps=10, pct_start=0.05),
     "phases must each last more than one step"),
    (lambda o: LRS.OneCycleLR(o, 0.01, 0.1, anneal_strategy="cosine"), "anneal_strategy"),
    (lambda o: LRS.PiecewiseConstantLR(o, [0.1, 0.01], milestones=[5, 10]),
     "one entry more than milestones"),
    (lambda o: LRS.PiecewiseConstantLR(o, [0.1, 0.01, 0.001], milestones=[10, 5]),
     "increasing order"),
    (lambda o: LRS.MultiStepLR(o, 0.1, 0.5, milestones=[-1]), r"milestones\[0\]=-1"),
    (lambda o: LRS.LambdaLR(o, 0.1, lr_lambda=[0.5]), r"lr_lambda\[0\] must be a function"),
    (lambda o: LRS.PolynomialLR(o, 0.1, 0.0, 10, power=0.0), "power must be > 0"),
    (lambda o: LRS.InverseSquareRootDecayLR(o, warmup_steps=0), "warmup_steps must be > 0"),
])
def test_arguments_are_validated(make, match):
    optimizer = cstorch.optim.SGD(_model().parameters(), lr=1.0)
    with pytest.raises(cstorch.ConfigError, match=match):
        make(optimizer)


# ---- configure_lr_scheduler -------------------------------------------------------------------
configure = schedules.configure_lr_scheduler


@pytest.fixture
def optimizer():
    return cstorch.optim.SGD(_model().parameters(), lr=1.0)


@pytest.mark.parametrize("value", [None, 0, 0.0, "", [], {}])
def test_configure_falsy_means_no_scheduler(optimizer, value):
    assert configure(optimizer, value) is None


@pytest.mark.parametrize("value", [0.01, "0.01", "1e-2"])
def test_configure_constant(optimizer, value):
    scheduler = configure(optimizer, value)
    assert isinstance(scheduler, LRS.ConstantLR)
    assert scheduler.get_last_lr() == pytest.approx([0.01])


@pytest.mark.parametrize("name", ["linear", "Linear", "LINEAR", "LinearLR", "linearlr"])
def test_configure_matches_names_case_insensitively(optimizer, name):
    scheduler = configure(optimizer, {"scheduler": name, "initial_learning_rate": 0.1,
                                      "end_learning_rate": 0.0, "total_iters": 10})
    assert type(scheduler) is LRS.LinearLR


@pytest.mark.parametrize("name, cls", [
    ("CosineDecay", LRS.CosineDecayLR), ("cosinedecaylr", LRS.CosineDecayLR),
    ("CosineAnnealingWarmRestarts", LRS.CosineAnnealingWarmRestarts),
    ("constant", LRS.ConstantLR), ("Step", LRS.StepLR), ("multistep", LRS.MultiStepLR),
])
def test_configure_resolves_every_spelling(optimizer, name, cls):
    arguments = {
        LRS.CosineDecayLR: dict(initial_learning_rate=0.1, end_learning_rate=0.0,
                                total_iters=10),
        LRS.CosineAnnealingWarmRestarts: dict(initial_learning_rate=0.1, T_0=10),
        LRS.ConstantLR: dict(learning_rate=0.1),
        LRS.StepLR: dict(initial_learning_rate=0.1, step_size=10, gamma=0.5),
        LRS.MultiStepLR: dict(initial_learning_rate=0.1, gamma=0.5, milestones=[5]),
    }[cls]
    assert type(configure(optimizer, {"scheduler": name, **arguments})) is cls


def test_configure_list_is_sequential_with_cumulative_milestones(optimizer):
    scheduler = configure(optimizer, [
        {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 0.1,
         "total_iters": 10},
        {"scheduler": "Constant", "learning_rate": 0.1, "total_iters": 20},
        {"scheduler": "CosineDecay", "initial_learning_rate": 0.1, "end_learning_rate": 0.0,
         "total_iters": 30}])
    assert isinstance(scheduler, LRS.SequentialLR) and scheduler._milestones == [10, 30]
    lrs = [scheduler.get_last_lr()[0]]
    for _ in range(60):
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    t = np.arange(61.0)
    expected = np.where(t < 10, ref_polynomial(t, 0.0, 0.1, 10), np.where(
        t < 30, 0.1, REFERENCES["CosineDecayLR"](np.maximum(t - 30, 0), 0.1, 0.0, 30)))
    assert_lrs(lrs, expected)


def test_configure_chained(optimizer):
    scheduler = configure(optimizer, [
        {"scheduler": "Constant", "learning_rate": 0.1, "main_scheduler": "chained"},
        {"scheduler": "Exponential", "initial_learning_rate": 1.0, "total_iters": 1,
         "decay_rate": 0.5, "main_scheduler": "ChainedLR"}])
    assert isinstance(scheduler, LRS.ChainedScheduler)
    scheduler.step()
    assert scheduler.get_last_lr() == pytest.approx([0.05])


def test_configure_nested_forms(optimizer):
    scheduler = configure(optimizer, {"SequentialLR": {"schedulers": [
        {"LinearLR": {"initial_learning_rate": 0.0, "end_learning_rate": 0.1,
                      "total_iters": 4}},
        {"scheduler": "ConstantLR", "learning_rate": 0.1}]}})
    assert isinstance(scheduler, LRS.SequentialLR) and scheduler._milestones == [4]
    chained = configure(optimizer, {"scheduler": "ChainedLR", "schedulers": [
        {"scheduler": "Constant", "learning_rate": 0.1},
        {"scheduler": "Step", "initial_learning_rate": 1.0, "step_size": 1, "gamma": 0.5}]})
    assert isinstance(chained, LRS.ChainedScheduler)


@pytest.mark.parametrize("spec, expected, actual", [
    ({"scheduler": "Linear", "initial_learning_rate": 0.1, "end_learning_rate": 0.0,
      "decay_steps": 10}, "total_iters", "decay_steps"),
    ({"scheduler": "Constant", "learning_rate": 0.1, "steps": 10}, "total_iters", "steps"),
    ({"scheduler": "Linear", "learning_rate": 0.1, "end_learning_rate": 0.0,
      "total_iters": 10}, "initial_learning_rate", "learning_rate"),
    ({"scheduler": "Step", "base_lr": 0.1, "step_size": 10, "gamma": 0.5},
     "initial_learning_rate", "base_lr"),
    ({"scheduler": "PiecewiseConstant", "values": [0.1, 0.01], "milestones": [5]},
     "learning_rates", "values"),
    ({"scheduler": "PiecewiseConstant", "learning_rates": [0.1, 0.01], "boundaries": [5]},
     "milestones", "boundaries"),
    ({"scheduler": "CosineAnnealing", "initial_learning_rate": 0.1, "t_max": 10},
     "T_max", "t_max"),
])
def test_configure_rejects_legacy_keys(optimizer, spec, expected, actual):
    with pytest.raises(cstorch.ConfigError,
                       match=f"no longer supported.*expected: {expected}, actual: {actual}"):
        configure(optimizer, spec)


@pytest.mark.parametrize("value, match", [
    ({"scheduler": "Linear", "initial_learning_rate": 0.1, "end_learning_rate": 0.0,
      "total_iters": 10, "warmup": 5}, r"unknown argument\(s\) \['warmup'\] for LinearLR"),
    ({"scheduler": "Linear", "initial_learning_rate": 0.1}, "needs the argument"),
    ({"scheduler": "Warmup", "learning_rate": 0.1}, "Invalid lr_scheduler type 'Warmup'"),
    ({"initial_learning_rate": 0.1, "total_iters": 10}, "no 'scheduler' key"),
    ("fast", "learning_rate must be a number, a dict or a list of dicts"),
    ([0.1, 0.01], r"learning_rate\[0\] must be a dict"),
    ([{"scheduler": "Step", "initial_learning_rate": 0.1, "step_size": 5, "gamma": 0.5},
      {"scheduler": "Constant", "learning_rate": 0.01}], r"\(StepLR\) has no total_iters"),
    ([{"scheduler": "Constant", "learning_rate": 0.1, "total_iters": 5,
       "main_scheduler": "chained"},
      {"scheduler": "Constant", "learning_rate": 0.01, "main_scheduler": "sequential"}],
     "main_scheduler values conflict"),
    ({"scheduler": "SequentialLR", "milestones": [3], "schedulers": [
        {"scheduler": "Constant", "learning_rate": 0.1, "total_iters": 5},
        {"scheduler": "Constant", "learning_rate": 0.01}]}, "do not match the running sum"),
])
def test_configure_errors(optimizer, value, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        configure(optimizer, value)
