"""Adamax (Adam in the infinity norm) with torch.optim numerics, as an optax transformation.

``scale_by_torch_adamax`` keeps torch's ``exp_avg`` and ``exp_inf`` under torch's names
(plus an int32 ``count``, torch's ``step``). The bias correction ``1 - b1^t``, which
torch takes in double precision, is evaluated in float32 without cancellation, so it
stays within a few ulps of torch's value.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ._adam import adam_family
from ._common import bias_correction, lerp, one_minus, zeros

__all__ = ["TorchAdamaxState", "adamax", "scale_by_torch_adamax"]


class TorchAdamaxState(NamedTuple):
    """State of :func:`scale_by_torch_adamax`, in torch's terms."""

    count: jax.Array  # int32: torch's state["step"]
    exp_avg: optax.Updates
    exp_inf: optax.Updates


def scale_by_torch_adamax(
    b1: ArrayLike = 0.9, b2: ArrayLike = 0.999, eps: ArrayLike = 1e-8
) -> optax.GradientTransformation:
    """Rescales updates with torch's Adamax moments.

    ``m = lerp(m, g, 1 - b1)``; ``u = max(b2 * u, |g| + eps)``; the update is
    ``m / u / (1 - b1^t)``.
    """

    one_minus_b1 = one_minus(b1)

    def init_fn(params):
        return TorchAdamaxState(jnp.zeros((), jnp.int32), zeros(params), zeros(params))

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        m = jax.tree.map(lambda m, g: lerp(m, g, one_minus_b1), state.exp_avg, updates)
        u = jax.tree.map(lambda u, g: jnp.maximum(u * b2, jnp.abs(g) + eps), state.exp_inf, updates)
        bc1 = bias_correction(b1, count.astype(jnp.float32))
        out = jax.tree.map(lambda m, u: (m / u) / bc1, m, u)
        return out, TorchAdamaxState(count, m, u)

    return optax.GradientTransformation(init_fn, update_fn)


def adamax(learning_rate: ArrayLike = 2e-3, b1: ArrayLike = 0.9, b2: ArrayLike = 0.999,
           eps: ArrayLike = 1e-8, weight_decay: ArrayLike = 0.0, *, maximize: bool = False,
) -> optax.GradientTransformation:
    """Adamax (Adam in the infinity norm), numerically as ``torch.optim.Adamax``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        u = max(b2 * u, |g| + eps)
        p = p - lr / (1 - b1^t) * m / u
    """
    return adam_family(scale_by_torch_adamax, learning_rate, b1, b2, eps, weight_decay,
                       maximize=maximize, decoupled=False)
