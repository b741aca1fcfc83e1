"""SGD with torch.optim.SGD numerics, as a pure optax transformation."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ...errors import ConfigError
from ._common import check_non_negative, maybe_negate, one_minus, scale_by_learning_rate

__all__ = ["MomentumState", "scale_by_torch_momentum", "sgd"]


class MomentumState(NamedTuple):
    """State of :func:`scale_by_torch_momentum`."""

    count: jax.Array  # int32: steps taken; the first step starts the buffer at g
    momentum_buffer: optax.Updates


def scale_by_torch_momentum(
    momentum: ArrayLike, dampening: ArrayLike = 0.0, *, nesterov: bool = False
) -> optax.GradientTransformation:
    """torch's heavy-ball momentum.

    ``buf_1 = g_1``; ``buf_t = momentum * buf_{t-1} + (1 - dampening) * g_t``; the
    update is ``buf_t``, or ``g_t + momentum * buf_t`` with ``nesterov``.
    """

    one_minus_dampening = one_minus(dampening)

    def init_fn(params):
        return MomentumState(jnp.zeros((), jnp.int32), jax.tree.map(jnp.zeros_like, params))

    def update_fn(updates, state, params=None):
        del params
        first = state.count == 0
        buf = jax.tree.map(
            lambda g, b: jnp.where(first, g, momentum * b + one_minus_dampening * g),
            updates, state.momentum_buffer,
        )
        if nesterov:
            out = jax.tree.map(lambda g, b: g + momentum * b, updates, buf)
        else:
            out = buf
        return out, MomentumState(optax.safe_increment(state.count), buf)

    return optax.GradientTransformation(init_fn, update_fn)


def sgd(learning_rate: ArrayLike, momentum: ArrayLike = 0.0, dampening: ArrayLike = 0.0,
        weight_decay: ArrayLike = 0.0, *, nesterov: bool = False, maximize: bool = False,
        use_momentum: bool | None = None) -> optax.GradientTransformation:
    """Stochastic gradient descent, numerically as ``torch.optim.SGD``.

    Update rule (``g`` the gradient, negated when ``maximize``)::

        g = g + weight_decay * p
        buf = g (first step)  else  momentum * buf + (1 - dampening) * g
        g = g + momentum * buf (nesterov)  else  buf          # when momentum != 0
        p = p - learning_rate * g

    Args:
      learning_rate: the step size (a number or a traced scalar).
      momentum: momentum factor; 0 disables the momentum buffer.
      dampening: dampening of the momentum.
      weight_decay: L2 penalty added to the gradient.
      nesterov: use Nesterov momentum (needs momentum > 0 and dampening == 0).
      maximize: maximize the objective instead of minimizing it.
      use_momentum: whether the momentum buffer exists; defaults to
        ``momentum != 0`` (give it explicitly when ``momentum`` is traced).
    """
    if use_momentum is None:
        check_non_negative("momentum", momentum)
        check_non_negative("dampening", dampening)
        use_momentum = float(momentum) != 0.0
        if nesterov and (not use_momentum or float(dampening) != 0.0):
            raise ConfigError("Nesterov momentum requires a momentum and zero dampening")
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("weight_decay", weight_decay)
    parts = [maybe_negate(maximize), optax.add_decayed_weights(weight_decay)]
    if use_momentum:
        parts.append(scale_by_torch_momentum(momentum, dampening, nesterov=nesterov))
    parts.append(scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)
