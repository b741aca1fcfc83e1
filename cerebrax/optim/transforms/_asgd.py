"""Averaged SGD (ASGD) with torch.optim numerics, as a pure optax transformation.

``scale_by_torch_asgd`` keeps torch's state under torch's names (the step size ``eta``,
the averaging weight ``mu``, the averaged parameters ``ax``, plus an int32 ``count``,
torch's ``step``) and mirrors the operation order of torch's single-tensor
implementation, so float32 results agree with torch's to a few ulps.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ._common import (ScalarOrSchedule, at, check_non_negative, is_concrete, maybe_negate, rounded,
                      zeros)

__all__ = ["ASGDState", "asgd", "scale_by_torch_asgd"]


class ASGDState(NamedTuple):
    """State of :func:`scale_by_torch_asgd`."""

    count: jax.Array  # int32: torch's state["step"]
    eta: jax.Array  # float32 step size of the next update
    mu: jax.Array  # float32 averaging weight of the next update
    ax: optax.Updates  # the averaged parameters


def scale_by_torch_asgd(learning_rate: ScalarOrSchedule = 1e-2, lambd: float = 1e-4,
                        alpha: float = 0.75, t0: float = 1e6) -> optax.GradientTransformation:
    """torch's averaged SGD; the update it returns is the whole parameter change.

    With ``eta`` and ``mu`` from the previous step (``eta = lr``, ``mu = 1`` at first)::

        p' = p * (1 - lambd * eta) - eta * g
        ax = p' if mu == 1 else ax + (p' - ax) * mu
        eta = lr / (1 + lambd * lr * t)^alpha;  mu = 1 / max(1, t - t0)

    and the update is ``p' - p``. It needs ``params``.
    """

    def init_fn(params):
        count = jnp.zeros((), jnp.int32)
        # The first update replaces eta with the learning rate of that step.
        eta = at(learning_rate, count) if is_concrete(learning_rate) else jnp.zeros(())
        return ASGDState(count, eta, jnp.ones((), jnp.float32), zeros(params))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("scale_by_torch_asgd needs params: call update(g, state, params)")
        lr = at(learning_rate, state.count)
        # torch creates eta from the learning rate at the first step.
        eta = jnp.where(state.count == 0, lr, state.eta)
        decay = 1.0 - lambd * eta
        new = jax.tree.map(lambda p, g: rounded(p * decay) + (-eta) * g, params, updates)
        ax = jax.tree.map(
            lambda a, q: jnp.where(state.mu == 1.0, q, a + rounded((q - a) * state.mu)),
            state.ax, new,
        )
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        next_eta = lr / jnp.exp(alpha * jnp.log1p(lambd * lr * t))
        next_mu = 1.0 / jnp.maximum(1.0, t - t0)
        out = jax.tree.map(lambda q, p: q - p, new, params)
        return out, ASGDState(count, next_eta, next_mu, ax)

    return optax.GradientTransformation(init_fn, update_fn)


def asgd(learning_rate: ScalarOrSchedule = 1e-2, lambd: float = 1e-4, alpha: float = 0.75,
         t0: float = 1e6, weight_decay: ArrayLike = 0.0, *, maximize: bool = False,
) -> optax.GradientTransformation:
    """Averaged SGD, numerically as ``torch.optim.ASGD``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step;
    ``eta_1 = lr``, ``mu_1 = 1``)::

        g = g + weight_decay * p
        p = p * (1 - lambd * eta_t) - eta_t * g
        ax = p if mu_t == 1 else ax + (p - ax) * mu_t
        eta_{t+1} = lr / (1 + lambd * lr * t)^alpha
        mu_{t+1} = 1 / max(1, t - t0)

    The averaged parameters ``ax`` live in the state; the parameters themselves follow
    plain SGD with the decaying step ``eta``.
    """
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("weight_decay", weight_decay)
    return optax.chain(
        maybe_negate(maximize),
        optax.add_decayed_weights(weight_decay),
        scale_by_torch_asgd(learning_rate, lambd, alpha, t0),
    )
