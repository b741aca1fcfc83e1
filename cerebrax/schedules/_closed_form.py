"""Learning-rate schedules as pure functions of the step (cstorch's closed forms).

Each factory validates its arguments eagerly and returns ``schedule(step) -> lr``:
for an integer step (a Python int, or an int32 array, traced or not) a float32 array
of the step's shape. These are what the ``LRScheduler`` classes evaluate; a JAX user
can pass them straight to optax.

Float32 accuracy. The step is an exact int32; everything that can be done on it
exactly (``t // step_size``, ``t mod period``, ``T - t``) is done in int32 before
it becomes a float, constants are computed in Python double precision, and the
formulas avoid cancellation:

- a blend ``end + (init - end) * w`` is written ``init * w + end * (1 - w)`` with both
  weights computed directly (``(T - t) / T`` and ``t / T``; ``sin(pi (T - t) / 2T)**2``
  and ``sin(pi t / 2T)**2`` for ``(1 +- cos(pi t / T)) / 2``), so a warmup from 0
  and a decay to 0 are both accurate to a few ulps;
- ``rate ** k`` for an integer ``k`` splits ``k * log(rate)`` into parts that are exact
  in float32 (``_float32.exp_times``), so ``0.999 ** 2000`` keeps float32 precision.

Every schedule is finite at ``step = 2**31 - 1``, the counter's saturation value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from ..errors import ConfigError
from . import _checks as checks
from . import _float32 as fp
from ._checks import INT32_MAX

__all__ = [
    "Schedule", "chained", "constant", "cosine_annealing", "cosine_annealing_warm_restarts",
    "cosine_decay", "cyclic", "exponential", "inverse_exponential_time_decay",
    "inverse_square_root_decay", "lambda_schedule", "linear", "multi_step", "multiplicative",
    "one_cycle", "piecewise_constant", "polynomial", "sequential", "step_decay",
]

Schedule = Callable[[ArrayLike], jax.Array]


# ---- constant and polynomial decays ------------------------------------------------
def constant(learning_rate: float) -> Schedule:
    """``lr(t) = learning_rate``."""
    lr = checks.number("learning_rate", learning_rate)

    def schedule(step: ArrayLike) -> jax.Array:
        return jnp.full(jnp.shape(step), lr, jnp.float32)

    return schedule


def polynomial(initial_learning_rate: float, end_learning_rate: float, total_iters: int,
               power: float = 1.0) -> Schedule:
    """``end + (init - end) * (1 - t / T) ** power`` for ``t < T``, then ``end``.

    Example:
      >>> polynomial(1.0, 0.0, 4, power=2.0)(2)
      Array(0.25, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    end = checks.number("end_learning_rate", end_learning_rate)
    total = checks.positive_int("total_iters", total_iters)
    power = checks.positive_number("power", power)

    def schedule(step: ArrayLike) -> jax.Array:
        t = jnp.minimum(fp.count(step), total)
        remaining, done = fp.to_float(total - t) / total, fp.to_float(t) / total
        if power == 1.0:
            return init * remaining + end * done
        # (1 - x)**p and 1 - (1 - x)**p as exp / -expm1 of p log(1 - x), the log taken
        # from whichever of x and 1 - x is more accurate.
        log_remaining = power * jnp.where(done < 0.5, jnp.log1p(-done), jnp.log(remaining))
        return init * jnp.exp(log_remaining) - end * jnp.expm1(log_remaining)

    return schedule


def linear(initial_learning_rate: float, end_learning_rate: float, total_iters: int) -> Schedule:
    """``init + (end - init) * min(t, T) / T``: a line, then ``end``.

    Example:
      >>> linear(0.1, 0.0, 10)(5)
      Array(0.05, dtype=float32)
    """
    return polynomial(initial_learning_rate, end_learning_rate, total_iters, power=1.0)


# ---- exponential and inverse-time decays ---------------------------------------------
def exponential(initial_learning_rate: float, total_iters: int, decay_rate: float,
                staircase: bool = False) -> Schedule:
    """``init * decay_rate ** (t / T)`` (``floor(t / T)`` with ``staircase``); no clamp.

    Example:
      >>> exponential(1.0, 10, 0.5)(10)
      Array(0.5, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    total = checks.positive_int("total_iters", total_iters)
    rate = checks.non_negative_number("decay_rate", decay_rate)
    staircase = checks.flag("staircase", staircase)

    def schedule(step: ArrayLike) -> jax.Array:
        t = fp.count(step)
        if staircase:
            return init * fp.power(rate, t // total)
        if rate == 0.0:
            return init * fp.power(rate, t)
        return init * fp.exp_times(t, math.log(rate) / total)

    return schedule


def inverse_exponential_time_decay(initial_learning_rate: float, step_exponent: float,
                                   total_iters: int, decay_rate: float,
                                   staircase: bool = False) -> Schedule:
    """``init / (1 + decay_rate * t ** step_exponent / T)`` (the quotient floored with
    ``staircase``; exactly for ``step_exponent == 1``, in float32 otherwise).

    Example:
      >>> inverse_exponential_time_decay(1.0, 1, 10, 1.0)(10)
      Array(0.5, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    exponent = checks.non_negative_number("step_exponent", step_exponent)
    total = checks.positive_int("total_iters", total_iters)
    rate = checks.non_negative_number("decay_rate", decay_rate)
    staircase = checks.flag("staircase", staircase)
    integer_exponent = int(exponent) if exponent.is_integer() else None

    def schedule(step: ArrayLike) -> jax.Array:
        t = fp.count(step)
        if staircase and integer_exponent == 1:
            x = fp.to_float(t // total)
        else:
            tf = fp.to_float(t)
            grown = tf**integer_exponent if integer_exponent is not None else tf**exponent
            x = jnp.floor(grown / total) if staircase else grown / total
        return init / (1.0 + rate * x)

    return schedule


def inverse_square_root_decay(initial_learning_rate: float = 1.0, scale: float = 1.0,
                              warmup_steps: float = 1) -> Schedule:
    """``init * scale / sqrt(max(t, warmup_steps))``.

    Example:
      >>> inverse_square_root_decay(1.0, 2.0, 4)(16)
      Array(0.5, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    factor = init * checks.number("scale", scale)
    warmup = checks.positive_number("warmup_steps", warmup_steps)

    def schedule(step: ArrayLike) -> jax.Array:
        return factor * jax.lax.rsqrt(jnp.maximum(fp.to_float(fp.count(step)), warmup))

    return schedule


# ---- step decays --------------------------------------------------------------------
def step_decay(initial_learning_rate: float, step_size: int, gamma: float) -> Schedule:
    """``init * gamma ** floor(t / step_size)`` (torch's ``StepLR``).

    Example:
      >>> step_decay(1.0, 10, 0.5)(25)
      Array(0.25, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    size = checks.positive_int("step_size", step_size)
    gamma = checks.non_negative_number("gamma", gamma)

    def schedule(step: ArrayLike) -> jax.Array:
        return init * fp.power(gamma, fp.count(step) // size)

    return schedule


def _table_lookup(values: Sequence[float], milestones: Sequence[int]) -> Schedule:
    table = jnp.asarray(np.asarray(values, np.float32))
    bounds = jnp.asarray(np.asarray(sorted(milestones), np.int32))

    def schedule(step: ArrayLike) -> jax.Array:
        # The number of milestones m <= t picks the entry.
        return table[jnp.searchsorted(bounds, fp.count(step), side="right")]

    return schedule


def multi_step(initial_learning_rate: float, gamma: float, milestones: Sequence[int]) -> Schedule:
    """``init * gamma ** #{m in milestones : m <= t}`` (torch's ``MultiStepLR``).

    Example:
      >>> multi_step(1.0, 0.1, [2, 4])(3)
      Array(0.1, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    gamma = checks.number("gamma", gamma)
    milestones = checks.step_list("milestones", milestones)
    return _table_lookup([init * gamma**k for k in range(len(milestones) + 1)], milestones)


def piecewise_constant(learning_rates: Sequence[float], milestones: Sequence[int]) -> Schedule:
    """``learning_rates[#{m in milestones : m <= t}]``.

    Example:
      >>> piecewise_constant([0.1, 0.01, 0.001], [10, 20])(15)
      Array(0.01, dtype=float32)
    """
    milestones = checks.step_list("milestones", milestones, non_decreasing=True)
    if isinstance(learning_rates, (str, bytes)) or not isinstance(learning_rates, Sequence):
        raise ConfigError(f"learning_rates must be a list of numbers, got {learning_rates!r}")
    rates = [checks.number(f"learning_rates[{i}]", v) for i, v in enumerate(learning_rates)]
    if len(rates) != len(milestones) + 1:
        raise ConfigError(
            f"learning_rates must have one entry more than milestones (a rate before the "
            f"first milestone and one after each); got {len(rates)} learning_rates and "
            f"{len(milestones)} milestones"
        )
    return _table_lookup(rates, milestones)


def multiplicative(initial_learning_rate: float, coefficient: float) -> Schedule:
    """``init * coefficient ** t``.

    Example:
      >>> multiplicative(1.0, 0.5)(3)
      Array(0.125, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    coefficient = checks.non_negative_number("coefficient", coefficient)

    def schedule(step: ArrayLike) -> jax.Array:
        return init * fp.power(coefficient, fp.count(step))

    return schedule


def _placeholder_lambdas() -> list[Callable[[jax.Array], ArrayLike]]:
    # cstorch's LambdaLR placeholders (override set_value_lambda to replace them).
    return [lambda t: fp.to_float(t) / 30.0, lambda t: fp.power(0.95, t)]


def lambda_schedule(initial_learning_rate: float,
                    lr_lambda: Callable | Sequence[Callable] | None = None) -> Schedule:
    """``prod_i init * lr_lambda_i(t)``: one lambda gives torch's ``LambdaLR``.

    Each lambda gets the int32 step and must use ``jnp`` ops (it is traced). Without
    a lambda, cstorch's placeholders ``t / 30`` and ``0.95 ** t`` are used.

    Example:
      >>> lambda_schedule(0.1, lambda t: jnp.minimum(1.0, (t + 1) / 10))(4)
      Array(0.05, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    if lr_lambda is None:
        lambdas = _placeholder_lambdas()
    else:
        lambdas = [lr_lambda] if callable(lr_lambda) else list(lr_lambda)
    for i, fn in enumerate(lambdas):
        if not callable(fn):
            raise ConfigError(f"lr_lambda[{i}] must be a function of the step, got {fn!r}")

    def schedule(step: ArrayLike) -> jax.Array:
        t = fp.count(step)
        lr = jnp.ones(t.shape, jnp.float32)
        for fn in lambdas:
            lr = lr * (init * jnp.asarray(fn(t), jnp.float32))
        return jnp.broadcast_to(lr, t.shape)

    return schedule


# ---- cosine schedules ----------------------------------------------------------------
def cosine_decay(initial_learning_rate: float, end_learning_rate: float,
                 total_iters: int) -> Schedule:
    """``end + (init - end) * (1 + cos(pi * min(t, T) / T)) / 2``.

    Example:
      >>> cosine_decay(1.0, 0.0, 10)(10)
      Array(0., dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    end = checks.number("end_learning_rate", end_learning_rate)
    total = checks.positive_int("total_iters", total_iters)

    def schedule(step: ArrayLike) -> jax.Array:
        t = jnp.minimum(fp.count(step), total)
        return fp.cosine_blend(init, end, fp.to_float(t), fp.to_float(total - t),
                               math.pi / (2 * total))

    return schedule


def cosine_annealing(initial_learning_rate: float, T_max: int,  # noqa: N803
                     eta_min: float = 0.0) -> Schedule:
    """``eta_min + (init - eta_min) * (1 + cos(pi * t / T_max)) / 2``, periodic in ``t``
    (period ``2 T_max``) like torch's ``CosineAnnealingLR``.

    Example:
      >>> cosine_annealing(1.0, 10)(30)
      Array(0., dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    period = checks.positive_int("T_max", T_max)
    eta_min = checks.number("eta_min", eta_min)

    def schedule(step: ArrayLike) -> jax.Array:
        phase = fp.mod(fp.count(step), 2 * period)
        remaining = jnp.abs(period - phase)  # distance to the next minimum
        return fp.cosine_blend(init, eta_min, fp.to_float(period - remaining),
                               fp.to_float(remaining), math.pi / (2 * period))

    return schedule


def _restart_tables(first: int, mult: int) -> tuple[np.ndarray, ...]:
    """Cycle starts (int32), ends clipped to int32 with the clipped excess, and
    ``pi / 2 T_i`` per cycle, for every cycle that starts within int32."""
    starts, ends, excess, scales = [], [], [], []
    start, length = 0, first
    while start <= INT32_MAX:
        starts.append(start)
        ends.append(min(start + length, INT32_MAX))
        excess.append(start + length - ends[-1])
        scales.append(math.pi / (2 * length))
        start, length = start + length, length * mult
    return (np.asarray(starts, np.int32), np.asarray(ends, np.int32),
            np.asarray(excess, np.float32), np.asarray(scales, np.float32))


def cosine_annealing_warm_restarts(initial_learning_rate: float, T_0: int,  # noqa: N803
                                   T_mult: int = 1, eta_min: float = 0.0) -> Schedule:
    """SGDR as in torch's ``CosineAnnealingWarmRestarts``: cycle ``i`` lasts
    ``T_i = T_0 * T_mult ** i`` steps, and within it
    ``lr = eta_min + (init - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2``
    with ``T_cur`` the steps since the cycle began (``t mod T_0`` when ``T_mult == 1``).

    Example:
      >>> restarts = cosine_annealing_warm_restarts(1.0, 10, T_mult=2)
      >>> restarts(jnp.array([0, 10, 30]))  # the restarts: cycles of 10, 20, 40 steps
      Array([1., 1., 1.], dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    first = checks.positive_int("T_0", T_0)
    mult = checks.positive_int("T_mult", T_mult)
    eta_min = checks.number("eta_min", eta_min)
    if mult == 1:
        def schedule(step: ArrayLike) -> jax.Array:
            elapsed = fp.mod(fp.count(step), first)
            return fp.cosine_blend(init, eta_min, fp.to_float(elapsed),
                                   fp.to_float(first - elapsed), math.pi / (2 * first))

        return schedule

    starts, ends, excess, scales = map(jnp.asarray, _restart_tables(first, mult))

    def schedule(step: ArrayLike) -> jax.Array:
        t = fp.count(step)
        cycle = jnp.searchsorted(starts, t, side="right") - 1
        remaining = fp.to_float(ends[cycle] - t) + excess[cycle]
        return fp.cosine_blend(init, eta_min, fp.to_float(t - starts[cycle]), remaining,
                               scales[cycle])

    return schedule


# ---- cyclic schedules ----------------------------------------------------------------
def cyclic(base_lr: float, max_lr: float, step_size_up: int = 2000,
           step_size_down: int | None = None, mode: str = "triangular", gamma: float = 1.0,
           scale_mode: str = "cycle") -> Schedule:
    """torch's ``CyclicLR``: ``base + (max - base) * rise(t) * h``, where ``rise`` climbs
    from 0 to 1 in ``step_size_up`` steps and falls back in ``step_size_down``, and
    ``h`` is 1 (``"triangular"``), ``2 ** -(cycle - 1)`` (``"triangular2"``) or
    ``gamma ** t`` (``"exp_range"``). As in cstorch and torch's built-in modes, the
    mode decides ``scale_mode``; the argument is accepted and checked only.

    Example:
      >>> cyclic(0.1, 1.0, step_size_up=4)(2)
      Array(0.55, dtype=float32)
    """
    base = checks.number("base_lr", base_lr)
    height = checks.number("max_lr", max_lr) - base
    up = checks.positive_int("step_size_up", step_size_up)
    down = up if step_size_down is None else checks.positive_int("step_size_down", step_size_down)
    mode = checks.choice("mode", mode, ("triangular", "triangular2", "exp_range"))
    gamma = checks.positive_number("gamma", gamma)
    checks.choice("scale_mode", scale_mode, ("cycle", "iterations"))
    size = up + down

    def schedule(step: ArrayLike) -> jax.Array:
        t = fp.count(step)
        completed = t // size if size <= INT32_MAX else jnp.zeros_like(t)
        within = t - completed * size
        rise = jnp.where(within <= up, fp.to_float(within) / up,
                         fp.to_float(size - within) / down)
        if mode == "triangular2":
            rise = rise * jnp.exp2(-fp.to_float(completed))
        elif mode == "exp_range":
            rise = rise * fp.power(gamma, t)
        return base + height * rise

    return schedule


def one_cycle(initial_learning_rate: float, max_lr: float, total_steps: int = 1000,
              pct_start: float = 0.3, final_div_factor: float = 1e4, three_phase: bool = False,
              anneal_strategy: str = "cos") -> Schedule:
    """torch's ``OneCycleLR`` with ``initial_learning_rate = max_lr / div_factor``.

    Phases end at steps ``[p N - 1, N - 1]`` (``three_phase``: ``[p N - 1, 2 p N - 2,
    N - 1]``) with ``p = pct_start`` and ``N = total_steps``; they anneal ``init -> max
    -> init / final_div_factor`` (``three_phase``: ``init -> max -> init -> min``) by
    ``end + (start - end) (1 + cos(pi x)) / 2`` or linearly, ``x`` being the fraction of
    the phase done. Past ``N - 1`` the last phase's formula continues, as in cstorch
    (torch raises instead); far past it (``t >> 2**24``) float32 cannot resolve the
    cosine's phase, so the rate there is only known to stay within the phase's range.

    Example:
      >>> one_cycle(0.1, 1.0, total_steps=10, pct_start=0.5, anneal_strategy="linear")(4)
      Array(1., dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    peak = checks.number("max_lr", max_lr)
    steps = checks.positive_int("total_steps", total_steps)
    pct = checks.number("pct_start", pct_start)
    if not 0.0 <= pct <= 1.0:
        raise ConfigError(f"pct_start must be in [0, 1], got {pct_start!r}")
    low = init / checks.positive_number("final_div_factor", final_div_factor)
    strategy = checks.choice("anneal_strategy", anneal_strategy, ("cos", "linear"))
    if checks.flag("three_phase", three_phase):
        ends = [pct * steps - 1, 2 * pct * steps - 2, steps - 1.0]
        values = [init, peak, init, low]
    else:
        ends = [pct * steps - 1, steps - 1.0]
        values = [init, peak, low]
    begins = [0.0, *ends[:-1]]
    if any(end <= begin for begin, end in zip(begins, ends)):
        raise ConfigError(
            f"OneCycle phases must each last more than one step; with total_steps={steps} "
            f"and pct_start={pct_start} they end at steps {ends}. Increase total_steps or "
            "move pct_start away from 0, 1 (and 0.5 with three_phase)."
        )

    def phase(t: jax.Array, i: int) -> jax.Array:
        elapsed, remaining, length = t - begins[i], ends[i] - t, ends[i] - begins[i]
        if strategy == "cos":
            return fp.cosine_blend(values[i], values[i + 1], elapsed, remaining,
                                   math.pi / (2 * length))
        return values[i] * (remaining / length) + values[i + 1] * (elapsed / length)

    def schedule(step: ArrayLike) -> jax.Array:
        t = fp.count(step)
        lr = phase(fp.to_float(t), 0)
        for i in range(1, len(ends)):
            # t > ends[i-1] for an integer t.
            lr = jnp.where(t >= math.floor(ends[i - 1]) + 1, phase(fp.to_float(t), i), lr)
        return lr

    return schedule


# ---- composition ---------------------------------------------------------------------
def sequential(schedules: Sequence[Schedule], milestones: Sequence[int]) -> Schedule:
    """``schedules[k](t - milestones[k - 1])`` with ``k = #{m in milestones : m <= t}``
    (torch's and cstorch's ``SequentialLR``: each schedule restarts from step 0).

    Example:
      >>> warmup_then_decay = sequential([linear(0.0, 1.0, 10), cosine_decay(1.0, 0.0, 90)], [10])
      >>> warmup_then_decay(jnp.array([5, 10, 100]))
      Array([0.5, 1. , 0. ], dtype=float32)
    """
    schedules = list(schedules)
    milestones = checks.step_list("milestones", milestones, non_decreasing=True)
    if not schedules or len(milestones) != len(schedules) - 1:
        raise ConfigError(
            f"SequentialLR needs one milestone fewer than schedulers (the step each "
            f"scheduler after the first starts at); got {len(schedules)} schedulers and "
            f"milestones={milestones}"
        )

    def schedule(step: ArrayLike) -> jax.Array:
        t = fp.count(step)
        lr = schedules[0](t)
        for start, later in zip(milestones, schedules[1:]):
            lr = jnp.where(t >= start, later(jnp.maximum(t - start, 0)), lr)
        return lr

    return schedule


def chained(schedules: Sequence[Schedule], *,
            initial_learning_rates: Sequence[float] | None = None) -> Schedule:
    """``schedules[0](t) * prod_{i >= 1} schedules[i](t) / initial_learning_rates[i - 1]``
    (cstorch's ``ChainedScheduler``: later schedules act as factors relative to their
    initial learning rate; by default their value at step 0).

    Example:
      >>> chained([constant(0.1), step_decay(1.0, 10, 0.5)])(10)
      Array(0.05, dtype=float32)
    """
    schedules = list(schedules)
    if not schedules:
        raise ConfigError("ChainedScheduler needs at least one scheduler, got none")
    later = schedules[1:]
    if initial_learning_rates is None:
        # Host sync point: evaluates the later schedules once, eagerly.
        initial_learning_rates = [float(s(0)) for s in later]
    divisors = [checks.number(f"initial_learning_rates[{i}]", v)
                for i, v in enumerate(initial_learning_rates)]
    if len(divisors) != len(later) or 0.0 in divisors:
        raise ConfigError(
            f"initial_learning_rates must hold one nonzero rate per schedule after the "
            f"first ({len(later)}), got {list(initial_learning_rates)!r}"
        )

    def schedule(step: ArrayLike) -> jax.Array:
        lr = schedules[0](step)
        for factor, divisor in zip(later, divisors):
            lr = lr * (factor(step) / divisor)
        return lr

    return schedule
