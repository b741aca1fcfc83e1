"""Laws of the pure schedules for random arguments and steps (hypothesis).

- Every schedule equals its float64 closed form (schedule_cases.py) at random steps up
  to 2**24, the range in which the schedules promise float32 accuracy (1cycle up to its
  last step, total_steps - 1, past which torch raises).
- The schedules whose closed form is continuous are continuous at their milestones
  (``total_iters``, the turns of a cycle, the phase ends of 1cycle, the switches of a
  ``sequential`` whose pieces join): no step moves the rate by more than the steepest
  slope of the closed form. Step decays, piecewise-constant rates and warm restarts jump
  by design and are left out.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from schedule_cases import FACTORIES, REFERENCES, assert_lrs

import cerebrax as cstorch
from cerebrax import schedules

# conftest's autouse fixture gives each test, not each example, a fresh cerebrax state;
# these properties only evaluate pure functions, so they share it safely.
PROPERTY = settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])

MAX_STEP = 2**24
STEPS = 16  # one shape for every example: the eager ops compile once

rate = st.floats(0.0, 1.0)
length = st.integers(1, 10**5)
short = st.integers(1, 1000)
milestone_list = st.lists(st.integers(0, 10**5), max_size=5)


def _inverse_time_decay():
    # The staircase floors t ** e / T: exact for e == 1 only (float32 otherwise). The
    # exponent is a float32 (t ** e is taken in float32: an exponent below float32's
    # range would become 0, and 0 ** 0 = 1 at step 0).
    smooth = st.fixed_dictionaries(dict(
        initial_learning_rate=rate, total_iters=short, decay_rate=rate,
        step_exponent=st.one_of(st.integers(0, 3), st.floats(0.0, 3.0, width=32))))
    stairs = st.fixed_dictionaries(dict(
        initial_learning_rate=rate, total_iters=short, decay_rate=rate,
        step_exponent=st.just(1), staircase=st.just(True)))
    return st.one_of(smooth, stairs)


def _piecewise_constant():
    return st.lists(st.integers(0, 10**5), max_size=5).flatmap(lambda ms: st.fixed_dictionaries(
        dict(milestones=st.just(sorted(ms)),
             learning_rates=st.lists(rate, min_size=len(ms) + 1, max_size=len(ms) + 1))))


def _warmup_lambda(a):
    return lambda t: 1.0 / (1.0 + a * t)


# (class, the strategy of its arguments, the largest step drawn)
FAMILIES = {
    "ConstantLR": (st.fixed_dictionaries(dict(learning_rate=rate)), MAX_STEP),
    "LinearLR": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, end_learning_rate=rate, total_iters=length)), MAX_STEP),
    "PolynomialLR": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, end_learning_rate=rate, total_iters=length,
        power=st.floats(0.1, 5.0))), MAX_STEP),
    "ExponentialLR": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, total_iters=short, decay_rate=rate,
        staircase=st.booleans())), MAX_STEP),
    "InverseExponentialTimeDecayLR": (_inverse_time_decay(), MAX_STEP),
    "InverseSquareRootDecayLR": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, scale=st.floats(0.1, 10.0),
        warmup_steps=st.floats(0.5, 1e4))), MAX_STEP),
    "CosineDecayLR": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, end_learning_rate=rate, total_iters=length)), MAX_STEP),
    "CosineAnnealingLR": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, T_max=length, eta_min=rate)), MAX_STEP),
    "CosineAnnealingWarmRestarts": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, T_0=short, T_mult=st.integers(1, 3), eta_min=rate)),
        MAX_STEP),
    "StepLR": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, step_size=short, gamma=rate)), MAX_STEP),
    "MultiStepLR": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, gamma=rate, milestones=milestone_list)), MAX_STEP),
    "MultiplicativeLR": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, coefficient=rate)), MAX_STEP),
    "PiecewiseConstantLR": (_piecewise_constant(), MAX_STEP),
    "LambdaLR": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, lr_lambda=st.floats(0.0, 1.0).map(_warmup_lambda))),
        MAX_STEP),
    "CyclicLR": (st.fixed_dictionaries(dict(
        base_lr=rate, max_lr=rate, step_size_up=short,
        step_size_down=st.one_of(st.none(), short),
        mode=st.sampled_from(["triangular", "triangular2", "exp_range"]),
        gamma=st.floats(0.5, 1.0))), MAX_STEP),
    # Past total_steps - 1 torch raises and cerebrax continues the last phase's formula;
    # the closed form is checked where both define it.
    "OneCycleLR": (st.fixed_dictionaries(dict(
        initial_learning_rate=rate, max_lr=rate, total_steps=st.integers(10, 10**4),
        pct_start=st.floats(0.05, 0.95), final_div_factor=st.floats(1.0, 1e4),
        three_phase=st.booleans(), anneal_strategy=st.sampled_from(["cos", "linear"]))),
        None),
}


FLOAT32_EPS = float(np.finfo(np.float32).eps)


def _tolerance(cls, kwargs):
    """rtol 1e-6; two schedules are accurate to a few float32 ulps of their largest rate
    rather than of their value (hypothesis found both):
    - CyclicLR computes ``base + (max - base) * rise``, which cancels when
      ``max_lr < base_lr`` (base_lr=0.9375, max_lr=0: 1.2e-6 of the rate 0.067);
    - OneCycleLR rounds its fractional phase ends (``pct_start * total_steps - 1``) to
      float32 before it takes the distance to them (total_steps=304, pct_start=0.5067,
      step 146: 2.2e-6 of the rate 0.0052).
    """
    rates = {"CyclicLR": ("base_lr", "max_lr"), "OneCycleLR": ("initial_learning_rate", "max_lr")}
    if cls not in rates:
        return dict(rtol=1e-6)
    largest = max(abs(kwargs[k]) for k in rates[cls])
    return dict(rtol=1e-6, atol=max(1e-12, 4 * FLOAT32_EPS * largest))


def _build(cls, kwargs):
    try:
        return FACTORIES[cls](**kwargs)
    except cstorch.ConfigError:
        reject()  # e.g. 1cycle phases of one step or less


@pytest.mark.parametrize("cls", FAMILIES)
@PROPERTY
@given(data=st.data())
def test_equals_its_closed_form_at_random_steps(cls, data):
    strategy, max_step = FAMILIES[cls]
    kwargs = data.draw(strategy, label="arguments")
    schedule = _build(cls, kwargs)
    if max_step is None:
        max_step = kwargs["total_steps"] - 1
    steps = data.draw(st.lists(st.integers(0, max_step), min_size=STEPS, max_size=STEPS),
                      label="steps")
    got = schedule(jnp.asarray(steps, jnp.int32))
    assert got.dtype == jnp.float32
    expected = REFERENCES[cls](np.asarray(steps, np.float64), **kwargs)
    assert_lrs(got, expected, **_tolerance(cls, kwargs))


# ---- continuity at the milestones ---------------------------------------------------------


def assert_no_jump(values, slope):
    """No step changes ``values`` by more than ``slope`` (and float32 rounding)."""
    values = np.asarray(values, np.float64)
    rounding = 4 * np.finfo(np.float32).eps * max(np.max(np.abs(values)), 1e-30)
    jumps = np.abs(np.diff(values))
    worst = int(np.argmax(jumps))
    assert jumps[worst] <= slope * (1 + 1e-5) + rounding, (
        f"step {worst} -> {worst + 1}: {values[worst]} -> {values[worst + 1]}, "
        f"more than the slope {slope}")


# Every continuity test evaluates steps 0..WINDOW - 1 (one shape: the eager ops compile
# once); its milestones all lie inside, with steps to spare after the last one.
WINDOW = 6010


def _window():
    return jnp.arange(WINDOW)


@PROPERTY
@given(init=rate, end=rate, total=short, power=st.floats(1.0, 4.0))
def test_decays_are_continuous_at_total_iters(init, end, total, power):
    steps = _window()
    for schedule, slope in [
        (schedules.linear(init, end, total), abs(end - init) / total),
        (schedules.polynomial(init, end, total, power), power * abs(end - init) / total),
        (schedules.cosine_decay(init, end, total), abs(end - init) * math.pi / (2 * total)),
    ]:
        values = np.asarray(schedule(steps))
        assert_no_jump(values, slope)
        assert_lrs(values[total:], end)  # the end rate from total_iters on


@PROPERTY
@given(init=rate, eta_min=rate, period=short)
def test_cosine_annealing_is_continuous_where_it_turns(init, eta_min, period):
    values = np.asarray(schedules.cosine_annealing(init, period, eta_min)(_window()))
    assert_no_jump(values, abs(init - eta_min) * math.pi / (2 * period))
    assert_lrs(values[[0, period, 2 * period, 3 * period]], [init, eta_min, init, eta_min])


@PROPERTY
@given(base=rate, peak=rate, up=short, down=short,
       mode=st.sampled_from(["triangular", "triangular2", "exp_range"]),
       gamma=st.floats(0.9, 1.0))
def test_cyclic_is_continuous_at_its_peaks_and_cycle_ends(base, peak, up, down, mode, gamma):
    values = schedules.cyclic(base, peak, up, down, mode, gamma)(_window())
    # |d(rise * gamma**t)| <= |d rise| + (1 - gamma) for rise in [0, 1], gamma <= 1.
    slope = abs(peak - base) * (1 / min(up, down) + (1 - gamma if mode == "exp_range" else 0))
    assert_no_jump(values, slope)


@PROPERTY
@given(init=rate, peak=rate, total_steps=st.integers(10, 2000),
       pct_start=st.floats(0.05, 0.95), final_div_factor=st.floats(1.0, 1e4),
       three_phase=st.booleans(), strategy=st.sampled_from(["cos", "linear"]))
def test_one_cycle_is_continuous_at_its_phase_ends(init, peak, total_steps, pct_start,
                                                    final_div_factor, three_phase, strategy):
    try:
        schedule = schedules.one_cycle(init, peak, total_steps, pct_start, final_div_factor,
                                       three_phase, strategy)
    except cstorch.ConfigError:
        reject()
    low = init / final_div_factor
    if three_phase:
        ends = [pct_start * total_steps - 1, 2 * pct_start * total_steps - 2, total_steps - 1]
        levels = [init, peak, init, low]
    else:
        ends = [pct_start * total_steps - 1, total_steps - 1]
        levels = [init, peak, low]
    lengths = np.diff([0.0, *ends])
    factor = math.pi / 2 if strategy == "cos" else 1.0
    slope = max(abs(b - a) * factor / n for a, b, n in zip(levels, levels[1:], lengths))
    # Up to total_steps - 1, where torch's 1cycle ends. Past it cerebrax continues the last
    # phase's formula with a float32 phase, which drifts with the distance to the end.
    assert_no_jump(np.asarray(schedule(_window()))[:total_steps], slope)


@PROPERTY
@given(start=rate, top=rate, end=rate, warmup=short, hold=st.integers(0, 100), decay=short)
def test_sequential_of_joining_pieces_is_continuous_at_the_milestones(start, top, end, warmup,
                                                                        hold, decay):
    """Warmup to ``top``, hold it, decay from it: each piece starts where the last ends."""
    pieces = [schedules.linear(start, top, warmup), schedules.constant(top),
              schedules.cosine_decay(top, end, decay)]
    milestones = [warmup, warmup + hold]
    schedule = schedules.sequential(pieces, milestones)
    values = np.asarray(schedule(_window()))
    assert_no_jump(values, max(abs(top - start) / warmup, abs(end - top) * math.pi / (2 * decay)))
    # At each milestone the rate is the earlier piece's rate continued to that step.
    assert_lrs(values[warmup], pieces[0](warmup))
    assert_lrs(values[warmup + hold], pieces[1](hold))
