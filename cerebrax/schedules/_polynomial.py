"""Constant, polynomial and linear learning-rate schedules (cstorch's closed forms).

Each factory validates its arguments eagerly and returns ``schedule(step) -> lr``:
for an integer step (a Python int, or an int32 array, traced or not) a float32 array
of the step's shape. These are what the ``LRScheduler`` classes evaluate; a JAX user
can pass them straight to optax.

The step is clamped to ``total_iters`` in int32 before it becomes a float, and a
blend ``end + (init - end) * w`` is written ``init * w + end * (1 - w)`` with both
weights computed directly (``(T - t) / T`` and ``t / T``), so a warmup from 0 and a
decay to 0 are both accurate to a few float32 ulps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from . import _checks as checks
from . import _float32 as fp
from ._base import Schedule

__all__ = ["constant", "linear", "polynomial"]


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
      >>> from cerebrax.schedules import polynomial
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
      >>> from cerebrax.schedules import linear
      >>> linear(0.1, 0.0, 10)(5)
      Array(0.05, dtype=float32)
    """
    return polynomial(initial_learning_rate, end_learning_rate, total_iters, power=1.0)
