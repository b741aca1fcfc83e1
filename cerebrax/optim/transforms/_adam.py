"""Adam and AdamW with torch.optim numerics, as pure optax transformations."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ._common import (
    check_in_unit_interval,
    check_non_negative,
    lerp,
    maybe_negate,
    one_minus,
    one_minus_power,
    scale_by_learning_rate,
)

__all__ = ["TorchAdamState", "adamw", "scale_by_torch_adam"]


class TorchAdamState(NamedTuple):
    """State of :func:`scale_by_torch_adam`, in torch's terms."""

    count: jax.Array  # int32: torch's state["step"]
    exp_avg: optax.Updates
    exp_avg_sq: optax.Updates
    max_exp_avg_sq: optax.Updates  # running max of exp_avg_sq (amsgrad); else empty


def scale_by_torch_adam(
    b1: ArrayLike = 0.9,
    b2: ArrayLike = 0.999,
    eps: ArrayLike = 1e-8,
    *,
    amsgrad: bool = False,
    correct_bias: bool = True,
) -> optax.GradientTransformation:
    """Rescales updates with torch's Adam moments.

    ``m = lerp(m, g, 1 - b1)``; ``v = b2 * v + (1 - b2) * g * g``; with bias
    correction the update is ``m / (sqrt(v) / sqrt(1 - b2^t) + eps) / (1 - b1^t)``,
    without it ``m / (sqrt(v) + eps)``. With ``amsgrad``, ``v`` in the denominator is
    the running maximum of ``v``.
    """

    one_minus_b1, one_minus_b2 = one_minus(b1), one_minus(b2)

    def init_fn(params):
        # Separate buffers for each moment: a donated state must not alias itself.
        def zeros():
            return jax.tree.map(jnp.zeros_like, params)

        return TorchAdamState(
            jnp.zeros((), jnp.int32), zeros(), zeros(), zeros() if amsgrad else ()
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


def adamw(
    learning_rate: ArrayLike = 1e-3,
    b1: ArrayLike = 0.9,
    b2: ArrayLike = 0.999,
    eps: ArrayLike = 1e-8,
    weight_decay: ArrayLike = 1e-2,
    *,
    amsgrad: bool = False,
    maximize: bool = False,
    correct_bias: bool = True,
) -> optax.GradientTransformation:
    """AdamW, numerically as ``torch.optim.AdamW``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        p = p * (1 - lr * weight_decay)                    # decoupled weight decay
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g^2                        # v_max = max(v_max, v) (amsgrad)
        p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    ``correct_bias=False`` (cstorch's option) drops both ``1 - b^t`` factors.

    Example:
      >>> tx = adamw(1e-3)
      >>> params = {"w": jnp.ones(2)}
      >>> updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
      >>> optax.apply_updates(params, updates)["w"]
      Array([0.99899, 0.99899], dtype=float32)
    """
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("epsilon", eps)
    check_non_negative("weight_decay", weight_decay)
    check_in_unit_interval("beta1", b1)
    check_in_unit_interval("beta2", b2)
    return optax.chain(
        maybe_negate(maximize),
        scale_by_torch_adam(b1, b2, eps, amsgrad=amsgrad, correct_bias=correct_bias),
        optax.add_decayed_weights(weight_decay),
        scale_by_learning_rate(learning_rate),
    )
