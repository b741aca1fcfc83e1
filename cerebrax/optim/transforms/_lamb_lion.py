"""Lamb and Lion with cstorch's numerics, as pure optax transformations.

torch.optim has neither optimizer; these follow cstorch's ``Lamb`` (no bias
correction, a layer-wise trust ratio on a clamped weight norm) and the standard Lion.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ._common import (check_in_unit_interval, check_non_negative, maybe_negate, one_minus,
                      scale_by_learning_rate)

__all__ = [
    "LambState",
    "LionState",
    "lamb",
    "lion",
    "scale_by_clamped_trust_ratio",
    "scale_by_lamb_moments",
    "scale_by_lion_sign",
]


class LambState(NamedTuple):
    """State of :func:`scale_by_lamb_moments`."""

    count: jax.Array  # int32: steps taken (Lamb's update does not depend on it)
    exp_avg: optax.Updates
    exp_avg_sq: optax.Updates


class LionState(NamedTuple):
    """State of :func:`scale_by_lion_sign`."""

    count: jax.Array  # int32: steps taken (Lion's update does not depend on it)
    exp_avg: optax.Updates


def _zeros(params: optax.Params) -> optax.Params:
    return jax.tree.map(jnp.zeros_like, params)


def scale_by_lamb_moments(
    b1: ArrayLike = 0.9, b2: ArrayLike = 0.999, eps: ArrayLike = 1e-6
) -> optax.GradientTransformation:
    """Adam's moments without bias correction: the update is ``m / (sqrt(v) + eps)``.

    ``m = b1 * m + (1 - b1) * g``; ``v = b2 * v + (1 - b2) * g * g``.
    """

    one_minus_b1, one_minus_b2 = one_minus(b1), one_minus(b2)

    def init_fn(params):
        # Separate buffers for each moment: a donated state must not alias itself.
        return LambState(jnp.zeros((), jnp.int32), _zeros(params), _zeros(params))

    def update_fn(updates, state, params=None):
        del params
        m = jax.tree.map(lambda m, g: b1 * m + one_minus_b1 * g, state.exp_avg, updates)
        v = jax.tree.map(
            lambda v, g: b2 * v + (one_minus_b2 * g) * g, state.exp_avg_sq, updates
        )
        out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), m, v)
        return out, LambState(optax.safe_increment(state.count), m, v)

    return optax.GradientTransformation(init_fn, update_fn)


def _norm(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(jnp.square(x)))


def scale_by_clamped_trust_ratio(
    max_weight_norm: ArrayLike = 10.0,
) -> optax.GradientTransformation:
    """Scales each parameter's update ``r`` by Lamb's layer-wise trust ratio.

    ``w = clip(||p||, 0, max_weight_norm)``; the ratio is ``w / ||r||``, or 1 when
    either norm is 0. Norms are Frobenius norms of the whole parameter tensor.
    """

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError(optax.NO_PARAMS_MSG)

        def scale(r, p):
            w = jnp.clip(_norm(p), 0.0, max_weight_norm)
            r_norm = _norm(r)
            ok = (w > 0) & (r_norm > 0)
            ratio = jnp.where(ok, w / jnp.where(ok, r_norm, 1.0), 1.0)
            return (ratio * r).astype(r.dtype)

        return jax.tree.map(scale, updates, params), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def lamb(learning_rate: ArrayLike = 1e-3, b1: ArrayLike = 0.9, b2: ArrayLike = 0.999,
         eps: ArrayLike = 1e-6, weight_decay: ArrayLike = 0.0, *, adam: bool = False,
         maximize: bool = False) -> optax.GradientTransformation:
    """Lamb, numerically as cstorch's ``Lamb``.

    Update rule (``g`` the gradient, negated when ``maximize``), per parameter tensor::

        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g^2
        r = m / (sqrt(v) + eps) + weight_decay * p          # no bias correction
        w = clip(||p||, 0, 10)
        trust = w / ||r||   if w > 0 and ||r|| > 0   else 1  # always 1 when adam=True
        p = p - learning_rate * trust * r

    Args:
      learning_rate: the step size (a number, traced scalar or schedule).
      b1: decay of the first moment.
      b2: decay of the second moment.
      eps: added to ``sqrt(v)`` in the denominator.
      weight_decay: coefficient of ``p`` added to the Adam step before the trust ratio.
      adam: drop the trust ratio (plain Adam without bias correction).
      maximize: maximize the objective instead of minimizing it.
    """
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("epsilon", eps)
    check_non_negative("weight_decay", weight_decay)
    check_in_unit_interval("beta1", b1)
    check_in_unit_interval("beta2", b2)
    return optax.chain(
        maybe_negate(maximize),
        scale_by_lamb_moments(b1, b2, eps),
        optax.add_decayed_weights(weight_decay),
        optax.identity() if adam else scale_by_clamped_trust_ratio(10.0),
        scale_by_learning_rate(learning_rate),
    )


def scale_by_lion_sign(
    b1: ArrayLike = 0.9, b2: ArrayLike = 0.99
) -> optax.GradientTransformation:
    """Lion's direction: ``sign(b1 * m + (1 - b1) * g)``, then ``m = b2 * m + (1 - b2) * g``."""

    one_minus_b1, one_minus_b2 = one_minus(b1), one_minus(b2)

    def init_fn(params):
        return LionState(jnp.zeros((), jnp.int32), _zeros(params))

    def update_fn(updates, state, params=None):
        del params
        out = jax.tree.map(
            lambda m, g: jnp.sign(b1 * m + one_minus_b1 * g), state.exp_avg, updates
        )
        m = jax.tree.map(lambda m, g: b2 * m + one_minus_b2 * g, state.exp_avg, updates)
        return out, LionState(optax.safe_increment(state.count), m)

    return optax.GradientTransformation(init_fn, update_fn)


def lion(learning_rate: ArrayLike = 1e-4, b1: ArrayLike = 0.9, b2: ArrayLike = 0.99,
         weight_decay: ArrayLike = 0.0, *, maximize: bool = False) -> optax.GradientTransformation:
    """Lion, numerically as cstorch's ``Lion``.

    Update rule (``g`` the gradient, negated when ``maximize``)::

        p = p * (1 - learning_rate * weight_decay)          # decoupled weight decay
        p = p - learning_rate * sign(b1 * m + (1 - b1) * g)
        m = b2 * m + (1 - b2) * g

    Args:
      learning_rate: the step size (a number, traced scalar or schedule).
      b1: interpolation between the momentum and the gradient for the update.
      b2: decay of the momentum.
      weight_decay: decoupled weight decay, scaled by the learning rate.
      maximize: maximize the objective instead of minimizing it.
    """
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("weight_decay", weight_decay)
    check_in_unit_interval("beta1", b1)
    check_in_unit_interval("beta2", b2)
    return optax.chain(
        maybe_negate(maximize),
        scale_by_lion_sign(b1, b2),
        optax.add_decayed_weights(weight_decay),
        scale_by_learning_rate(learning_rate),
    )
