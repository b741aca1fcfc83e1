"""RAdam (rectified Adam) with torch.optim numerics, as an optax transformation.

torch evaluates RAdam's rectification ``rho_t`` and the bias corrections in double
precision. Here the first rectified step (``rho_t > 5``) is found in double precision
when the transformation is built, so the branch switches at torch's step, and ``rho_t``
is evaluated in float32 in a form that avoids cancellation; ``v.mul_(b2)`` is rounded
before the add as in torch, so the moments match torch's bit for bit on CPU.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ._adam import adam_family
from ._common import bias_correction, lerp, one_minus, static_float, update_second_moment, zeros

__all__ = ["TorchRAdamState", "radam", "scale_by_torch_radam"]


class TorchRAdamState(NamedTuple):
    """State of :func:`scale_by_torch_radam`, in torch's terms."""

    count: jax.Array  # int32: torch's state["step"]
    exp_avg: optax.Updates
    exp_avg_sq: optax.Updates


def _one_minus_x_over_expm1(x: jax.Array) -> jax.Array:
    """``1 - x / (e^x - 1)`` for ``x > 0``, without cancellation near 0.

    Below 1 it is ``(e^x - 1 - x) / (e^x - 1)`` with the numerator from its Taylor
    series ``x^2/2 * sum_j 2 x^j / (j + 2)!`` (truncation below float32 precision).
    """
    small = jnp.minimum(x, 1.0)
    series = jnp.zeros_like(small)
    for j in range(11, -1, -1):
        series = series * small + 2.0 / math.factorial(j + 2)
    near_zero = (0.5 * small * small * series) / jnp.expm1(small)
    return jnp.where(x < 1.0, near_zero, 1.0 - x / jnp.expm1(x))


class _RAdamConstants(NamedTuple):
    log_b2: float  # -log(b2) > 0
    rho_offset: float  # rho_inf - 2 / log_b2
    rect_scale: float  # rho_inf / ((rho_inf - 4) * (rho_inf - 2))
    first_rectified_step: int  # the first step with rho_t > 5 (2**31 - 1: never)


def _rho(b2: float, t: int) -> float:
    """torch's ``rho_t``, in double precision."""
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    return rho_inf - 2.0 * t * b2**t / (1.0 - b2**t)


def _radam_constants(b2: float) -> _RAdamConstants:
    never = 2**31 - 1
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    if b2 == 0.0 or rho_inf <= 5.0:  # rho_t < rho_inf: the rectified branch never runs
        return _RAdamConstants(1.0, 0.0, 0.0, never)
    first = 1
    while _rho(b2, first) <= 5.0:  # rho_t increases towards rho_inf > 5
        first += 1
    log_b2 = -math.log(b2)
    return _RAdamConstants(
        log_b2, rho_inf - 2.0 / log_b2, rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0)), first
    )


def scale_by_torch_radam(
    b1: ArrayLike = 0.9, b2: float = 0.999, eps: ArrayLike = 1e-8
) -> optax.GradientTransformation:
    """Rescales updates with torch's RAdam moments and variance rectification.

    ``m = lerp(m, g, 1 - b1)``; ``v = b2 * v + (1 - b2) * g^2``;
    ``rho_inf = 2 / (1 - b2) - 1``; ``rho_t = rho_inf - 2 t b2^t / (1 - b2^t)``. The
    update is ``m / (1 - b1^t)`` times, when ``rho_t > 5``,
    ``sqrt(1 - b2^t) / (sqrt(v) + eps) * r_t`` with
    ``r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))``.

    ``b2`` is a Python number: the first rectified step is found in double precision
    when the transformation is built, so the branch switches at torch's step.
    """

    b2 = static_float("b2", b2)
    const = _radam_constants(b2)
    one_minus_b1, one_minus_b2 = one_minus(b1), one_minus(b2)

    def init_fn(params):
        return TorchRAdamState(jnp.zeros((), jnp.int32), zeros(params), zeros(params))

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        m = jax.tree.map(lambda m, g: lerp(m, g, one_minus_b1), state.exp_avg, updates)
        v = jax.tree.map(
            lambda v, g: update_second_moment(v, g, b2, one_minus_b2), state.exp_avg_sq, updates
        )
        bc1 = bias_correction(b1, t)
        bc2_sqrt = jnp.sqrt(bias_correction(b2, t))
        # rho_t = rho_inf - (2 / L) * x / expm1(x) with x = t * L, L = -log(b2).
        rho = const.rho_offset + (2.0 / const.log_b2) * _one_minus_x_over_expm1(t * const.log_b2)
        rect = jnp.sqrt((rho - 4.0) * (rho - 2.0) / rho * const.rect_scale)
        rectified = count >= const.first_rectified_step

        def direction(m, v):
            corrected = m / bc1
            adaptive = bc2_sqrt / (jnp.sqrt(v) + eps)
            return jnp.where(rectified, corrected * adaptive * rect, corrected)

        return jax.tree.map(direction, m, v), TorchRAdamState(count, m, v)

    return optax.GradientTransformation(init_fn, update_fn)


def radam(learning_rate: ArrayLike = 1e-3, b1: ArrayLike = 0.9, b2: float = 0.999,
          eps: ArrayLike = 1e-8, weight_decay: ArrayLike = 0.0, *, maximize: bool = False,
          decoupled_weight_decay: bool = False) -> optax.GradientTransformation:
    """RAdam (rectified Adam), numerically as ``torch.optim.RAdam``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        g = g + weight_decay * p                  # p = p * (1 - lr * weight_decay)
                                                  #   with decoupled_weight_decay
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g^2
        rho_inf = 2 / (1 - b2) - 1;  rho_t = rho_inf - 2 t b2^t / (1 - b2^t)
        p = p - lr * m / (1 - b1^t) * sqrt(1 - b2^t) / (sqrt(v) + eps) * r_t  if rho_t > 5
        p = p - lr * m / (1 - b1^t)                                            otherwise
        r_t = sqrt((rho_t - 4) (rho_t - 2) rho_inf / ((rho_inf - 4) (rho_inf - 2) rho_t))

    ``b2`` must be a Python number (see :func:`scale_by_torch_radam`).
    """
    return adam_family(scale_by_torch_radam, learning_rate, b1, b2, eps, weight_decay,
                       maximize=maximize, decoupled=decoupled_weight_decay)
