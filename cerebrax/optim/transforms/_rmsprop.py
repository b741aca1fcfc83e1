"""RMSprop with torch.optim numerics, as a pure optax transformation.

``scale_by_torch_rmsprop`` keeps torch's running average of squared gradients, and the
momentum buffer and gradient average where the settings use them, under torch's names
(plus an int32 ``count``, torch's ``step``) and mirrors the operation order of torch's
single-tensor implementation, so float32 results agree with torch's to a few ulps.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ._common import (ScalarOrSchedule, check_non_negative, lerp, maybe_negate, one_minus, rounded,
                      scale_by_learning_rate, zeros)

__all__ = ["RMSpropState", "rmsprop", "scale_by_torch_rmsprop"]


class RMSpropState(NamedTuple):
    """State of :func:`scale_by_torch_rmsprop`; absent buffers are ``()``."""

    count: jax.Array  # int32: torch's state["step"]
    square_avg: optax.Updates  # running average of g^2
    momentum_buffer: optax.Updates  # with momentum; else ()
    grad_avg: optax.Updates  # running average of g (centered); else ()


def scale_by_torch_rmsprop(alpha: float = 0.99, eps: ArrayLike = 1e-8, momentum: ArrayLike = 0.0,
                           *, centered: bool = False, use_momentum: bool | None = None,
) -> optax.GradientTransformation:
    """torch's RMSprop scaling.

    ``v = alpha * v + (1 - alpha) * g^2``; centered: ``m = lerp(m, g, 1 - alpha)`` and
    ``avg = sqrt(v - m^2) + eps``, else ``avg = sqrt(v) + eps``. The update is
    ``g / avg``, or with momentum ``buf = momentum * buf + g / avg`` (``buf_0 = 0``).
    ``use_momentum`` (default ``momentum > 0``) says whether the buffer exists.
    """

    one_minus_alpha = one_minus(alpha)
    if use_momentum is None:
        use_momentum = float(momentum) > 0.0

    def init_fn(params):
        return RMSpropState(jnp.zeros((), jnp.int32), zeros(params),
                            zeros(params) if use_momentum else (),
                            zeros(params) if centered else ())

    def update_fn(updates, state, params=None):
        del params
        sq = jax.tree.map(lambda v, g: rounded(v * alpha) + (one_minus_alpha * g) * g,
                          state.square_avg, updates)
        if centered:
            gavg = jax.tree.map(lambda m, g: lerp(m, g, one_minus_alpha),
                                state.grad_avg, updates)
            avg = jax.tree.map(lambda v, m: jnp.sqrt(v - m * m) + eps, sq, gavg)
        else:
            gavg = ()
            avg = jax.tree.map(lambda v: jnp.sqrt(v) + eps, sq)
        out = jax.tree.map(lambda g, a: g / a, updates, avg)
        if use_momentum:
            out = buf = jax.tree.map(lambda b, u: rounded(b * momentum) + u,
                                     state.momentum_buffer, out)
        else:
            buf = ()
        return out, RMSpropState(optax.safe_increment(state.count), sq, buf, gavg)

    return optax.GradientTransformation(init_fn, update_fn)


def rmsprop(learning_rate: ScalarOrSchedule = 1e-2, alpha: float = 0.99, eps: ArrayLike = 1e-8,
            weight_decay: ArrayLike = 0.0, momentum: ArrayLike = 0.0, *, centered: bool = False,
            maximize: bool = False, use_momentum: bool | None = None,
) -> optax.GradientTransformation:
    """RMSprop, numerically as ``torch.optim.RMSprop``.

    Update rule (``g`` the gradient, negated when ``maximize``)::

        g = g + weight_decay * p
        v = alpha * v + (1 - alpha) * g^2
        m = alpha * m + (1 - alpha) * g;  avg = sqrt(v - m^2) + eps   # centered
        avg = sqrt(v) + eps                                            # otherwise
        buf = momentum * buf + g / avg;  p = p - lr * buf              # momentum > 0
        p = p - lr * g / avg                                           # otherwise

    Args:
      use_momentum: whether the momentum buffer exists; defaults to ``momentum > 0``
        (give it explicitly when ``momentum`` is traced).
    """
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("epsilon", eps)
    check_non_negative("momentum", momentum)
    check_non_negative("weight_decay", weight_decay)
    check_non_negative("alpha", alpha)
    return optax.chain(
        maybe_negate(maximize),
        optax.add_decayed_weights(weight_decay),
        scale_by_torch_rmsprop(alpha, eps, momentum, centered=centered,
                               use_momentum=use_momentum),
        scale_by_learning_rate(learning_rate),
    )
