"""Learning-rate schedules as pure functions of the step (cstorch's closed forms).

Each factory validates its arguments eagerly and returns ``schedule(step) -> lr``,
a float32 array for an integer (or traced int32) step. These are what the
``LRScheduler`` classes evaluate; a JAX user can pass them straight to optax.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from ..errors import ConfigError

__all__ = ["Schedule", "constant", "cosine_decay", "linear", "polynomial"]

Schedule = Callable[[ArrayLike], jax.Array]


def _number(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _step(step: ArrayLike) -> jax.Array:
    return jnp.asarray(step).astype(jnp.float32)


def constant(learning_rate: float) -> Schedule:
    """``lr(t) = learning_rate``."""
    lr = _number("learning_rate", learning_rate)

    def schedule(step: ArrayLike) -> jax.Array:
        del step
        return jnp.full((), lr, jnp.float32)

    return schedule


def polynomial(
    initial_learning_rate: float, end_learning_rate: float, total_iters: int,
    power: float = 1.0,
) -> Schedule:
    """``end + (init - end) * (1 - min(t, T) / T) ** power`` (``end`` from ``T`` on).

    Example:
      >>> polynomial(1.0, 0.0, 4, power=2.0)(2)
      Array(0.25, dtype=float32)
    """
    init = _number("initial_learning_rate", initial_learning_rate)
    end = _number("end_learning_rate", end_learning_rate)
    total = _positive_int("total_iters", total_iters)
    power = _number("power", power)

    def schedule(step: ArrayLike) -> jax.Array:
        frac = 1.0 - jnp.minimum(_step(step), total) / total
        return end + (init - end) * frac**power

    return schedule


def linear(initial_learning_rate: float, end_learning_rate: float, total_iters: int) -> Schedule:
    """``init + (end - init) * min(t, T) / T``: a line, then ``end``.

    Example:
      >>> linear(0.1, 0.0, 10)(5)
      Array(0.05, dtype=float32)
    """
    return polynomial(initial_learning_rate, end_learning_rate, total_iters, power=1.0)


def cosine_decay(
    initial_learning_rate: float, end_learning_rate: float, total_iters: int
) -> Schedule:
    """``end + (init - end) * (1 + cos(pi * min(t, T) / T)) / 2``.

    Example:
      >>> cosine_decay(1.0, 0.0, 10)(10)
      Array(0., dtype=float32)
    """
    init = _number("initial_learning_rate", initial_learning_rate)
    end = _number("end_learning_rate", end_learning_rate)
    total = _positive_int("total_iters", total_iters)

    def schedule(step: ArrayLike) -> jax.Array:
        t = jnp.minimum(_step(step), total)
        # (1 + cos(pi t / T)) / 2 == sin(pi (T - t) / 2T) ** 2: no float32 cancellation
        # near t = T, and exactly `end` from t = T on.
        return end + (init - end) * jnp.sin(jnp.pi * (total - t) / (2 * total)) ** 2

    return schedule
