"""Step-wise and per-step factor schedules (cstorch's closed forms).

Each factory validates its arguments eagerly and returns ``schedule(step) -> lr``:
for an integer step (a Python int, or an int32 array, traced or not) a float32 array
of the step's shape. These are what the ``LRScheduler`` classes evaluate; a JAX user
can pass them straight to optax.

Step decay, multi-step decay, piecewise-constant rates, a constant factor per step and
products of lambdas of the step. Step counts such as ``t // step_size`` are taken in
int32, milestones are found by a search over an int32 table, and ``rate ** k`` for an
integer ``k`` splits ``k * log(rate)`` into parts that are exact in float32
(:func:`._float32.power`), so ``0.999 ** 2000`` keeps float32 precision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from ..errors import ConfigError
from . import _checks as checks
from . import _float32 as fp
from ._base import Schedule
from ._exponential import power_decay

__all__ = ["lambda_schedule", "multi_step", "multiplicative", "piecewise_constant", "step_decay"]


def step_decay(initial_learning_rate: float, step_size: int, gamma: float) -> Schedule:
    """``init * gamma ** floor(t / step_size)`` (torch's ``StepLR``).

    Example:
      >>> from cerebrax.schedules import step_decay
      >>> step_decay(1.0, 10, 0.5)(25)
      Array(0.25, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    size = checks.positive_int("step_size", step_size)
    gamma = checks.non_negative_number("gamma", gamma)
    return power_decay(init, gamma, size, staircase=True)


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
      >>> from cerebrax.schedules import multi_step
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
      >>> from cerebrax.schedules import piecewise_constant
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
      >>> from cerebrax.schedules import multiplicative
      >>> multiplicative(1.0, 0.5)(3)
      Array(0.125, dtype=float32)
    """
    init = checks.number("initial_learning_rate", initial_learning_rate)
    coefficient = checks.non_negative_number("coefficient", coefficient)
    return power_decay(init, coefficient, 1, staircase=False)


def _placeholder_lambdas() -> list[Callable[[jax.Array], ArrayLike]]:
    # cstorch's LambdaLR placeholders (override set_value_lambda to replace them).
    return [lambda t: fp.to_float(t) / 30.0, lambda t: fp.power(0.95, t)]


def lambda_schedule(initial_learning_rate: float,
                    lr_lambda: Callable | Sequence[Callable] | None = None) -> Schedule:
    """``prod_i init * lr_lambda_i(t)``: one lambda gives torch's ``LambdaLR``.

    Each lambda gets the int32 step and must use ``jnp`` ops (it is traced). Without
    a lambda, cstorch's placeholders ``t / 30`` and ``0.95 ** t`` are used.

    Example:
      >>> from cerebrax.schedules import lambda_schedule
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
