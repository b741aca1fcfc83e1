"""Adam and AdamW with torch.optim numerics, as pure optax transformations.

Also the pieces the Adam family (Adamax, NAdam, RAdam) shares: the hyperparameter
checks and the weight decay, either an L2 penalty on the gradient or torch's decoupled
``p.mul_(1 - lr * weight_decay)``, written so that XLA's fused multiply-adds round the
product as torch does and a long run does not drift from torch's parameters.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from ...errors import ConfigError
from ._common import (check_in_unit_interval, check_non_negative, lerp, maybe_negate, one_minus,
                      one_minus_power, scale_by_learning_rate, zeros)

__all__ = [
    "TorchAdamState",
    "adam",
    "adamw",
    "add_decoupled_weight_decay",
    "scale_by_torch_adam",
]


class TorchAdamState(NamedTuple):
    """State of :func:`scale_by_torch_adam`, in torch's terms."""

    count: jax.Array  # int32: torch's state["step"]
    exp_avg: optax.Updates
    exp_avg_sq: optax.Updates
    max_exp_avg_sq: optax.Updates  # running max of exp_avg_sq (amsgrad); else empty


def scale_by_torch_adam(b1: ArrayLike = 0.9, b2: ArrayLike = 0.999, eps: ArrayLike = 1e-8, *,
                        amsgrad: bool = False, correct_bias: bool = True,
) -> optax.GradientTransformation:
    """Rescales updates with torch's Adam moments.

    ``m = lerp(m, g, 1 - b1)``; ``v = b2 * v + (1 - b2) * g * g``; with bias
    correction the update is ``m / (sqrt(v) / sqrt(1 - b2^t) + eps) / (1 - b1^t)``,
    without it ``m / (sqrt(v) + eps)``. With ``amsgrad``, ``v`` in the denominator is
    the running maximum of ``v``.
    """

    one_minus_b1, one_minus_b2 = one_minus(b1), one_minus(b2)

    def init_fn(params):
        return TorchAdamState(
            jnp.zeros((), jnp.int32), zeros(params), zeros(params), zeros(params) if amsgrad else ()
        )

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        m = jax.tree.map(lambda m, g: lerp(m, g, one_minus_b1), state.exp_avg, updates)
        v = jax.tree.map(lambda v, g: v * b2 + (one_minus_b2 * g) * g, state.exp_avg_sq, updates)
        vmax = jax.tree.map(jnp.maximum, state.max_exp_avg_sq, v) if amsgrad else ()
        t = count.astype(jnp.float32)
        if correct_bias:
            bc1 = one_minus_power(b1, t)
            bc2_sqrt = jnp.sqrt(one_minus_power(b2, t))
        else:
            bc1 = bc2_sqrt = jnp.ones((), jnp.float32)
        denom_of = vmax if amsgrad else v
        out = jax.tree.map(lambda m, d: (m / (jnp.sqrt(d) / bc2_sqrt + eps)) / bc1, m, denom_of)
        return out, TorchAdamState(count, m, v, vmax)

    return optax.GradientTransformation(init_fn, update_fn)


def _one_minus_float32_factor(lr: ArrayLike, weight_decay: ArrayLike) -> ArrayLike:
    """``1 - f`` for the float32 factor ``f = 1 - lr * weight_decay`` (torch's rounding)."""
    if isinstance(lr, (int, float)) and isinstance(weight_decay, (int, float)):
        return 1.0 - float(np.float32(1.0 - float(lr) * float(weight_decay)))
    factor = (1.0 - jnp.asarray(lr, jnp.float32) * weight_decay).astype(jnp.float32)
    return 1.0 - factor


def add_decoupled_weight_decay(
    learning_rate: ArrayLike, weight_decay: ArrayLike
) -> optax.GradientTransformation:
    """Decays the parameters by ``1 - learning_rate * weight_decay`` before the update.

    Returns ``(p * f + u) - p`` for the incoming update ``u`` and the float32 factor
    ``f = 1 - learning_rate * weight_decay``, so that ``p + update`` is torch's
    ``p.mul_(f)`` followed by ``p.add_(u)``, rounding for rounding (the outer
    subtraction is exact): a long run does not drift from torch the way
    ``u - learning_rate * weight_decay * p`` would. ``p * f`` is written
    ``p - p * (1 - f)``: ``1 - f`` is exact, and a compiler that fuses the multiply
    into the subtraction still rounds ``p * f`` once, where fusing ``p * f + u``
    would skip torch's rounding of ``p * f``. Place it after the learning-rate
    scaling. ``learning_rate`` may be a schedule of the step.
    """
    scheduled = callable(learning_rate)

    def init_fn(params):
        del params
        if scheduled:
            return optax.ScaleByScheduleState(jnp.zeros((), jnp.int32))
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        if params is None:
            raise ConfigError(
                "add_decoupled_weight_decay needs the parameters: call "
                "tx.update(updates, state, params)"
            )
        lr = learning_rate(state.count) if scheduled else learning_rate
        shrink = _one_minus_float32_factor(lr, weight_decay)
        out = jax.tree.map(lambda u, p: ((p - p * shrink) + u) - p, updates, params)
        if scheduled:
            state = optax.ScaleByScheduleState(optax.safe_increment(state.count))
        return out, state

    return optax.GradientTransformation(init_fn, update_fn)


def _check_adam_family(learning_rate, b1, b2, eps, weight_decay) -> None:
    """The hyperparameter checks every Adam-family factory makes."""
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("epsilon", eps)
    check_non_negative("weight_decay", weight_decay)
    check_in_unit_interval("beta1", b1)
    check_in_unit_interval("beta2", b2)


def adam_family(scale_by: Callable[[ArrayLike, ArrayLike, ArrayLike],
                                   optax.GradientTransformation],
                learning_rate: ArrayLike, b1: ArrayLike, b2: ArrayLike, eps: ArrayLike,
                weight_decay: ArrayLike, *, maximize: bool, decoupled: bool,
) -> optax.GradientTransformation:
    """An Adam-family optimizer around its moment scaling ``scale_by(b1, b2, eps)``.

    The hyperparameter checks every member makes, then ``maximize``, L2 (``g + wd * p``)
    or decoupled (``p * (1 - lr * wd)``) decay, and the learning rate. The ``scale_by``
    state is the third entry of the chain's state for every setting.
    """
    _check_adam_family(learning_rate, b1, b2, eps, weight_decay)
    return optax.chain(
        maybe_negate(maximize),
        optax.identity() if decoupled else optax.add_decayed_weights(weight_decay),
        scale_by(b1, b2, eps),
        scale_by_learning_rate(learning_rate),
        add_decoupled_weight_decay(learning_rate, weight_decay) if decoupled else optax.identity(),
    )


def adam(learning_rate: ArrayLike = 1e-3, b1: ArrayLike = 0.9, b2: ArrayLike = 0.999,
         eps: ArrayLike = 1e-8, weight_decay: ArrayLike = 0.0, *, amsgrad: bool = False,
         maximize: bool = False, decoupled_weight_decay: bool = False,
) -> optax.GradientTransformation:
    """Adam, numerically as ``torch.optim.Adam``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        g = g + weight_decay * p                  # p = p * (1 - lr * weight_decay)
                                                  #   with decoupled_weight_decay
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g^2               # v_max = max(v_max, v) (amsgrad)
        p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    """
    return adam_family(functools.partial(scale_by_torch_adam, amsgrad=amsgrad), learning_rate,
                       b1, b2, eps, weight_decay, maximize=maximize,
                       decoupled=decoupled_weight_decay)


def adamw(learning_rate: ArrayLike = 1e-3, b1: ArrayLike = 0.9, b2: ArrayLike = 0.999,
          eps: ArrayLike = 1e-8, weight_decay: ArrayLike = 1e-2, *, amsgrad: bool = False,
          maximize: bool = False, correct_bias: bool = True) -> optax.GradientTransformation:
    """AdamW, numerically as ``torch.optim.AdamW``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        p = p * (1 - lr * weight_decay)                    # decoupled weight decay
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g^2                        # v_max = max(v_max, v) (amsgrad)
        p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    ``correct_bias=False`` (cstorch's option) drops both ``1 - b^t`` factors.
    """
    _check_adam_family(learning_rate, b1, b2, eps, weight_decay)
    return optax.chain(
        maybe_negate(maximize),
        scale_by_torch_adam(b1, b2, eps, amsgrad=amsgrad, correct_bias=correct_bias),
        optax.add_decayed_weights(weight_decay),
        scale_by_learning_rate(learning_rate),
    )
