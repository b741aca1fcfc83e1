"""Adagrad with torch.optim numerics, as a pure optax transformation.

``scale_by_torch_adagrad`` keeps torch's running sum of squared gradients under torch's
name (plus an int32 ``count``, torch's ``step``) and mirrors the operation order of
torch's single-tensor implementation, so float32 results agree with torch's to a few
ulps.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ._common import (ScalarOrSchedule, check_non_negative, full, maybe_negate,
                      scale_by_learning_rate)

__all__ = ["AdagradState", "adagrad", "scale_by_torch_adagrad"]


class AdagradState(NamedTuple):
    """State of :func:`scale_by_torch_adagrad`."""

    count: jax.Array  # int32: torch's state["step"]
    sum: optax.Updates  # running sum of squared gradients


def scale_by_torch_adagrad(
    lr_decay: ArrayLike = 0.0, eps: ArrayLike = 1e-10, initial_accumulator_value: float = 0.0
) -> optax.GradientTransformation:
    """Rescales updates by torch's Adagrad accumulator.

    ``sum = sum + g * g``; the update is ``g / (sqrt(sum) + eps) / (1 + (t - 1) * lr_decay)``
    (``t`` the step, from 1), ``sum`` starting at ``initial_accumulator_value``.
    """

    def init_fn(params):
        return AdagradState(jnp.zeros((), jnp.int32), full(params, initial_accumulator_value))

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        acc = jax.tree.map(lambda s, g: s + g * g, state.sum, updates)
        decay = 1.0 + state.count.astype(jnp.float32) * lr_decay
        out = jax.tree.map(lambda g, s: g / (jnp.sqrt(s) + eps) / decay, updates, acc)
        return out, AdagradState(count, acc)

    return optax.GradientTransformation(init_fn, update_fn)


def adagrad(learning_rate: ScalarOrSchedule = 1e-2, lr_decay: ArrayLike = 0.0,
            weight_decay: ArrayLike = 0.0, initial_accumulator_value: float = 0.0,
            eps: ArrayLike = 1e-10, *, maximize: bool = False) -> optax.GradientTransformation:
    """Adagrad, numerically as ``torch.optim.Adagrad``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        g = g + weight_decay * p
        sum = sum + g^2                            # sum_0 = initial_accumulator_value
        p = p - lr / (1 + (t - 1) * lr_decay) * g / (sqrt(sum) + eps)
    """
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("lr_decay", lr_decay)
    check_non_negative("weight_decay", weight_decay)
    check_non_negative("initial_accumulator_value", initial_accumulator_value)
    check_non_negative("epsilon", eps)
    return optax.chain(
        maybe_negate(maximize),
        optax.add_decayed_weights(weight_decay),
        scale_by_torch_adagrad(lr_decay, eps, initial_accumulator_value),
        scale_by_learning_rate(learning_rate),
    )
