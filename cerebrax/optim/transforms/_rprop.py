"""Rprop (resilient backpropagation) with torch.optim numerics, as an optax transformation.

``scale_by_torch_rprop`` keeps torch's previous gradient and per-element step sizes
under torch's names (plus an int32 ``count``, torch's ``step``) and mirrors the
operation order of torch's single-tensor implementation, so float32 results agree with
torch's to a few ulps.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ...errors import ConfigError
from ._common import (ScalarOrSchedule, at, check_non_negative, full, is_concrete, maybe_negate,
                      zeros)

__all__ = ["RpropState", "rprop", "scale_by_torch_rprop"]


class RpropState(NamedTuple):
    """State of :func:`scale_by_torch_rprop`."""

    count: jax.Array  # int32: torch's state["step"]
    prev: optax.Updates  # the previous (masked) gradient
    step_size: optax.Updates  # per-element step sizes


def scale_by_torch_rprop(
    learning_rate: ScalarOrSchedule = 1e-2,
    etas: tuple[ArrayLike, ArrayLike] = (0.5, 1.2),
    step_sizes: tuple[ArrayLike, ArrayLike] = (1e-6, 50.0),
) -> optax.GradientTransformation:
    """torch's resilient backpropagation; the update it returns is ``sign(g) * step``.

    Elementwise, with ``s = sign(g * prev)``: ``step = clip(step * (eta_plus if s > 0,
    eta_minus if s < 0, 1 if s == 0), *step_sizes)``; where ``s < 0`` the gradient is
    zeroed; ``prev = g``. ``step`` starts at the learning rate of the first step.
    """
    eta_minus, eta_plus = etas
    step_min, step_max = step_sizes

    def init_fn(params):
        if is_concrete(learning_rate):
            return RpropState(jnp.zeros((), jnp.int32), zeros(params),
                              full(params, at(learning_rate, jnp.zeros((), jnp.int32))))
        return RpropState(jnp.zeros((), jnp.int32), zeros(params), zeros(params))

    def factor(g, prev):
        s = jnp.sign(g * prev)
        s = jnp.where(s > 0, jnp.asarray(eta_plus, s.dtype), s)
        s = jnp.where(s < 0, jnp.asarray(eta_minus, s.dtype), s)
        return jnp.where(s == 0, jnp.ones((), s.dtype), s)

    def update_fn(updates, state, params=None):
        del params
        # torch fills the step sizes with the learning rate of the first step.
        first, lr = state.count == 0, at(learning_rate, state.count)
        sizes = jax.tree.map(lambda z: jnp.where(first, lr.astype(z.dtype), z), state.step_size)
        signs = jax.tree.map(factor, updates, state.prev)
        sizes = jax.tree.map(lambda z, s: jnp.clip(z * s, step_min, step_max), sizes, signs)
        grads = jax.tree.map(
            lambda g, s: jnp.where(s == jnp.asarray(eta_minus, s.dtype), jnp.zeros_like(g), g),
            updates, signs,
        )
        out = jax.tree.map(lambda g, z: jnp.sign(g) * z, grads, sizes)
        return out, RpropState(optax.safe_increment(state.count), grads, sizes)

    return optax.GradientTransformation(init_fn, update_fn)


def _check_etas(etas: tuple[ArrayLike, ArrayLike]) -> None:
    if all(is_concrete(e) for e in etas) and not 0.0 < float(etas[0]) < 1.0 < float(etas[1]):
        raise ConfigError(
            f"Invalid eta values: {etas[0]}, {etas[1]} (expected 0 < etas[0] < 1 < etas[1])"
        )


def rprop(learning_rate: ScalarOrSchedule = 1e-2, etas: tuple[ArrayLike, ArrayLike] = (0.5, 1.2),
          step_sizes: tuple[ArrayLike, ArrayLike] = (1e-6, 50.0), *, maximize: bool = False,
) -> optax.GradientTransformation:
    """Rprop, numerically as ``torch.optim.Rprop``.

    Update rule, elementwise (``g`` the gradient, negated when ``maximize``;
    ``step`` starts at ``learning_rate``, which is used for nothing else)::

        f = eta_plus if g * prev > 0, eta_minus if g * prev < 0, else 1
        step = clip(step * f, step_sizes[0], step_sizes[1])
        g = 0 where g * prev < 0
        p = p - sign(g) * step
        prev = g
    """
    check_non_negative("learning_rate", learning_rate)
    _check_etas(etas)
    return optax.chain(
        maybe_negate(maximize),
        scale_by_torch_rprop(learning_rate, etas, step_sizes),
        optax.scale(-1.0),
    )
