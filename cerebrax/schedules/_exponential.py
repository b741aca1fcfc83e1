"""Exponential, inverse-time and inverse-square-root decays (cstorch's closed forms).

Each factory validates its arguments eagerly and returns ``schedule(step) -> lr``:
for an integer step (a Python int, or an int32 array, traced or not) a float32 array
of the step's shape. These are what the ``LRScheduler`` classes evaluate; a JAX user
can pass them straight to optax.

``rate ** (t / T)`` splits ``t * log(rate) / T`` into parts that are exact in float32
(:func:`._float32.exp_times`), so ``0.999 ** 2000`` keeps float32 precision; the
staircase quotient ``t // T`` is taken in int32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from . import _checks as checks
from . import _float32 as fp
from ._base import Schedule

__all__ = ["exponential", "inverse_exponential_time_decay", "inverse_square_root_decay"]


def exponential(initial_learning_rate: float, total_iters: int, decay_rate: float,
                staircase: bool = False) -> Schedule:
    """``init * decay_rate ** (t / T)`` (``floor(t / T)`` with ``staircase``); no clamp.

    Example:
      >>> from cerebrax.schedules import exponential
      >>> exponential(1.0, 10, 0.5)(10)
      Array(0.5, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    total = checks.positive_int("total_iters", total_iters)
    rate = checks.non_negative_number("decay_rate", decay_rate)
    return power_decay(init, rate, total, checks.flag("staircase", staircase))


def power_decay(init: float, rate: float, period: int, staircase: bool) -> Schedule:
    """``init * rate ** (t / period)``, or ``init * rate ** floor(t / period)`` with
    ``staircase``, for checked arguments (``rate >= 0``, an int ``period >= 1``): the
    closed form of :func:`exponential`, and of ``step_decay`` and ``multiplicative``."""

    def schedule(step: ArrayLike) -> jax.Array:
        t = fp.count(step)
        if staircase:
            return init * fp.power(rate, t // period)
        if rate == 0.0:
            return init * fp.power(rate, t)
        return init * fp.exp_times(t, math.log(rate) / period)

    return schedule


def inverse_exponential_time_decay(initial_learning_rate: float, step_exponent: float,
                                   total_iters: int, decay_rate: float,
                                   staircase: bool = False) -> Schedule:
    """``init / (1 + decay_rate * t ** step_exponent / T)`` (the quotient floored with
    ``staircase``; exactly for ``step_exponent == 1``, in float32 otherwise).

    Example:
      >>> from cerebrax.schedules import inverse_exponential_time_decay
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
      >>> from cerebrax.schedules import inverse_square_root_decay
      >>> inverse_square_root_decay(1.0, 2.0, 4)(16)
      Array(0.5, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    factor = init * checks.number("scale", scale)
    warmup = checks.positive_number("warmup_steps", warmup_steps)

    def schedule(step: ArrayLike) -> jax.Array:
        return factor * jax.lax.rsqrt(jnp.maximum(fp.to_float(fp.count(step)), warmup))

    return schedule
