"""Cosine decay, cosine annealing and warm restarts (cstorch's closed forms).

Each factory validates its arguments eagerly and returns ``schedule(step) -> lr``:
for an integer step (a Python int, or an int32 array, traced or not) a float32 array
of the step's shape. These are what the ``LRScheduler`` classes evaluate; a JAX user
can pass them straight to optax.

The position in a cycle (``t mod period``, ``T - t``) is taken exactly in int32, and
``(1 +- cos(pi t / T)) / 2`` is written ``sin(pi (T - t) / 2T)**2`` and
``sin(pi t / 2T)**2`` (:func:`._float32.cosine_blend`), so the rate near either end of
a cycle is accurate to a few float32 ulps.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from . import _checks as checks
from . import _float32 as fp
from ._base import Schedule
from ._checks import INT32_MAX

__all__ = ["cosine_annealing", "cosine_annealing_warm_restarts", "cosine_decay"]


def cosine_decay(initial_learning_rate: float, end_learning_rate: float,
                 total_iters: int) -> Schedule:
    """``end + (init - end) * (1 + cos(pi * min(t, T) / T)) / 2``.

    Example:
      >>> from cerebrax.schedules import cosine_decay
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
      >>> from cerebrax.schedules import cosine_annealing
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
      >>> from cerebrax.schedules import cosine_annealing_warm_restarts
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
