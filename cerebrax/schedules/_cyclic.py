"""Cyclic and one-cycle learning-rate schedules (cstorch's closed forms).

Each factory validates its arguments eagerly and returns ``schedule(step) -> lr``:
for an integer step (a Python int, or an int32 array, traced or not) a float32 array
of the step's shape. These are what the ``LRScheduler`` classes evaluate; a JAX user
can pass them straight to optax.

The position in a cycle is taken exactly in int32 before it becomes a float; the
one-cycle phases anneal with the cancellation-free cosine blend of
:func:`._float32.cosine_blend` or linearly.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from ..errors import ConfigError
from . import _checks as checks
from . import _float32 as fp
from ._base import Schedule
from ._checks import INT32_MAX

__all__ = ["cyclic", "one_cycle"]


def cyclic(base_lr: float, max_lr: float, step_size_up: int = 2000,
           step_size_down: int | None = None, mode: str = "triangular", gamma: float = 1.0,
           scale_mode: str = "cycle") -> Schedule:
    """torch's ``CyclicLR``: ``base + (max - base) * rise(t) * h``, where ``rise`` climbs
    from 0 to 1 in ``step_size_up`` steps and falls back in ``step_size_down``, and
    ``h`` is 1 (``"triangular"``), ``2 ** -(cycle - 1)`` (``"triangular2"``) or
    ``gamma ** t`` (``"exp_range"``). As in cstorch and torch's built-in modes, the
    mode decides ``scale_mode``; the argument is accepted and checked only.

    Example:
      >>> from cerebrax.schedules import cyclic
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
      >>> from cerebrax.schedules import one_cycle
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
