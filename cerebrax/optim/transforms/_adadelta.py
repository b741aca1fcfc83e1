"""Adadelta with torch.optim numerics, as a pure optax transformation.

``scale_by_torch_adadelta`` keeps torch's running averages of squared gradients and
squared updates under torch's names (plus an int32 ``count``, torch's ``step``) and
mirrors the operation order of torch's single-tensor implementation, rounding the
products torch rounds, so float32 results agree with torch's to a few ulps.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ...errors import ConfigError
from ._common import (ScalarOrSchedule, check_non_negative, is_concrete, maybe_negate, one_minus,
                      rounded, scale_by_learning_rate, zeros)

__all__ = ["AdadeltaState", "adadelta", "scale_by_torch_adadelta"]


class AdadeltaState(NamedTuple):
    """State of :func:`scale_by_torch_adadelta`."""

    count: jax.Array  # int32: torch's state["step"]
    square_avg: optax.Updates  # running average of g^2
    acc_delta: optax.Updates  # running average of the squared updates


def scale_by_torch_adadelta(
    rho: float = 0.9, eps: ArrayLike = 1e-6
) -> optax.GradientTransformation:
    """torch's Adadelta scaling.

    ``v = rho * v + (1 - rho) * g^2``; ``d = sqrt(u + eps) / sqrt(v + eps) * g``;
    ``u = rho * u + (1 - rho) * d^2``; the update is ``d``.
    """

    one_minus_rho = one_minus(rho)

    def init_fn(params):
        return AdadeltaState(jnp.zeros((), jnp.int32), zeros(params), zeros(params))

    def update_fn(updates, state, params=None):
        del params
        sq = jax.tree.map(lambda v, g: rounded(v * rho) + (one_minus_rho * g) * g,
                          state.square_avg, updates)
        delta = jax.tree.map(
            lambda u, v, g: jnp.sqrt(u + eps) / rounded(jnp.sqrt(v + eps)) * g,
            state.acc_delta, sq, updates,
        )
        acc = jax.tree.map(lambda u, d: rounded(u * rho) + (one_minus_rho * d) * d,
                           state.acc_delta, delta)
        return delta, AdadeltaState(optax.safe_increment(state.count), sq, acc)

    return optax.GradientTransformation(init_fn, update_fn)


def _check_closed_unit(name: str, value: ArrayLike) -> None:
    if is_concrete(value) and not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"Invalid {name} value: {value!r} (expected 0 <= {name} <= 1)")


def adadelta(learning_rate: ScalarOrSchedule = 1.0, rho: float = 0.9, eps: ArrayLike = 1e-6,
             weight_decay: ArrayLike = 0.0, *, maximize: bool = False,
) -> optax.GradientTransformation:
    """Adadelta, numerically as ``torch.optim.Adadelta``.

    Update rule (``g`` the gradient, negated when ``maximize``)::

        g = g + weight_decay * p
        v = rho * v + (1 - rho) * g^2
        d = sqrt(u + eps) / sqrt(v + eps) * g
        u = rho * u + (1 - rho) * d^2
        p = p - lr * d
    """
    check_non_negative("learning_rate", learning_rate)
    _check_closed_unit("rho", rho)
    check_non_negative("epsilon", eps)
    check_non_negative("weight_decay", weight_decay)
    return optax.chain(
        maybe_negate(maximize),
        optax.add_decayed_weights(weight_decay),
        scale_by_torch_adadelta(rho, eps),
        scale_by_learning_rate(learning_rate),
    )
