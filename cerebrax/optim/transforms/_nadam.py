"""NAdam (Adam with Nesterov momentum) with torch.optim numerics, as an optax transformation.

torch derives NAdam's momentum schedule ``mu_t = b1 * (1 - 0.5 * 0.96^(t * psi))``
(``psi`` being ``momentum_decay``) and the bias correction in double precision, and
keeps the running product ``mu_product`` in float32. Here ``mu_t`` is evaluated in
float32 in a form that avoids cancellation and rounds once, so it is float32(torch's
``mu_t``) nearly always and the float32 ``mu_product`` does not drift; ``v.mul_(b2)``
is rounded before the add as in torch, so the moments match torch's bit for bit on CPU.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from ._adam import adam_family
from ._common import (bias_correction, check_non_negative, lerp, one_minus, static_float,
                      update_second_moment, zeros)

__all__ = ["TorchNAdamState", "nadam", "scale_by_torch_nadam"]


class TorchNAdamState(NamedTuple):
    """State of :func:`scale_by_torch_nadam`, in torch's terms."""

    count: jax.Array  # int32: torch's state["step"]
    mu_product: jax.Array  # float32 scalar: the product of the momentum schedule
    exp_avg: optax.Updates
    exp_avg_sq: optax.Updates


def _nadam_momentum(b1: ArrayLike, log_decay: float, t: jax.Array):
    """``(mu_t, 1 - mu_t)`` with ``mu_t = b1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))``.

    With ``e = expm1(t * momentum_decay * log(0.96))``, ``mu_t = b1/2 - b1/2 * e`` and
    ``1 - mu_t = (1 - b1/2) + b1/2 * e``. For a Python ``b1``, ``b1/2 = hi + lo`` is split
    into a float32 head and the rest, so the small terms are summed first and ``mu_t``
    is rounded once: it is then float32(torch's double ``mu_t``) nearly always, and the
    float32 ``mu_product`` (which torch keeps) does not drift.
    """
    e = jnp.expm1(t * log_decay)
    if not isinstance(b1, (int, float)):
        half = 0.5 * b1
        return half - half * e, (1.0 - half) + half * e
    half = 0.5 * float(b1)
    hi = float(np.float32(half))
    # The barrier keeps XLA from folding ``hi + (lo - x)`` into ``(hi + lo) - x``.
    small = jax.lax.optimization_barrier((half - hi) - hi * e)
    return hi + small, (1.0 - half) + hi * e


def scale_by_torch_nadam(b1: ArrayLike = 0.9, b2: ArrayLike = 0.999, eps: ArrayLike = 1e-8,
                         momentum_decay: float = 4e-3) -> optax.GradientTransformation:
    """Rescales updates with torch's NAdam moments and momentum schedule.

    With ``mu_t = b1 * (1 - 0.5 * 0.96^(t * momentum_decay))`` and
    ``P_t = mu_1 * ... * mu_t`` (``mu_product``, kept in float32 as torch does)::

        m = lerp(m, g, 1 - b1);  v = b2 * v + (1 - b2) * g^2
        d = sqrt(v / (1 - b2^t)) + eps
        update = (1 - mu_t) / (1 - P_t) * g / d + mu_{t+1} / (1 - P_t * mu_{t+1}) * m / d
    """

    log_decay = static_float("momentum_decay", momentum_decay) * math.log(0.96)
    one_minus_b1, one_minus_b2 = one_minus(b1), one_minus(b2)

    def init_fn(params):
        return TorchNAdamState(
            jnp.zeros((), jnp.int32), jnp.ones((), jnp.float32), zeros(params), zeros(params)
        )

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        mu, one_minus_mu = _nadam_momentum(b1, log_decay, t)
        mu_next, _ = _nadam_momentum(b1, log_decay, t + 1.0)
        mu_product = state.mu_product * mu
        grad_coef = one_minus_mu / (1.0 - mu_product)
        avg_coef = mu_next / (1.0 - mu_product * mu_next)
        m = jax.tree.map(lambda m, g: lerp(m, g, one_minus_b1), state.exp_avg, updates)
        v = jax.tree.map(
            lambda v, g: update_second_moment(v, g, b2, one_minus_b2), state.exp_avg_sq, updates
        )
        bc2 = bias_correction(b2, t)
        out = jax.tree.map(
            lambda g, m, v: _nadam_direction(g, m, jnp.sqrt(v / bc2) + eps, grad_coef, avg_coef),
            updates,
            m,
            v,
        )
        return out, TorchNAdamState(count, mu_product, m, v)

    return optax.GradientTransformation(init_fn, update_fn)


def _nadam_direction(g, m, denom, grad_coef, avg_coef):
    return (grad_coef * g) / denom + (avg_coef * m) / denom


def nadam(learning_rate: ArrayLike = 2e-3, b1: ArrayLike = 0.9, b2: ArrayLike = 0.999,
          eps: ArrayLike = 1e-8, weight_decay: ArrayLike = 0.0, momentum_decay: float = 4e-3, *,
          maximize: bool = False, decoupled_weight_decay: bool = False,
) -> optax.GradientTransformation:
    """NAdam (Adam with Nesterov momentum), numerically as ``torch.optim.NAdam``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        g = g + weight_decay * p                  # p = p * (1 - lr * weight_decay)
                                                  #   with decoupled_weight_decay
        mu_t = b1 * (1 - 0.5 * 0.96^(t * momentum_decay));  P_t = mu_1 * ... * mu_t
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g^2
        d = sqrt(v / (1 - b2^t)) + eps
        p = p - lr * (1 - mu_t) / (1 - P_t) * g / d
              - lr * mu_{t+1} / (1 - P_t * mu_{t+1}) * m / d
    """
    check_non_negative("momentum_decay", momentum_decay)
    return adam_family(lambda b1, b2, eps: scale_by_torch_nadam(b1, b2, eps, momentum_decay),
                       learning_rate, b1, b2, eps, weight_decay, maximize=maximize,
                       decoupled=decoupled_weight_decay)
