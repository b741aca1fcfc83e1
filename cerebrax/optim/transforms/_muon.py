"""Muon (momentum orthogonalized by Newton-Schulz), as a pure optax transformation.

The published rule (Keller Jordan's Muon, as ``torch.optim.Muon`` also has it): a
heavy-ball momentum buffer, a Nesterov blend, then the matrix is replaced by an
approximately orthogonal one with the same singular vectors, from a few iterations of
a quintic Newton-Schulz polynomial, and scaled so that tall and wide matrices get
updates of the same root-mean-square size.

Parameters that are not matrices have no such orthogonalization. cerebrax does not
refuse them (a model's biases and norm gains are usually in the same optimizer in a
cstorch configuration): a 0-D or 1-D parameter gets the plain momentum step (SGD with
the same momentum, Nesterov blend, learning rate and decoupled weight decay), and a
parameter with more than two dimensions (a convolution's filters) is orthogonalized as
the matrix ``(shape[0], prod(shape[1:]))``, as the published code does for 4-D filters.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ...errors import ConfigError
from ._adam import add_decoupled_weight_decay
from ._common import check_non_negative, scale_by_learning_rate, zeros

__all__ = ["MuonState", "muon", "orthogonalize", "scale_by_muon"]

# The quintic's coefficients (a, b, c): X <- a X + (b A + c A^2) X with A = X X^T.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7  # added to the Frobenius norm that the iteration starts from


class MuonState(NamedTuple):
    """State of :func:`scale_by_muon`."""

    count: jax.Array  # int32: steps taken (0: torch's state is still empty)
    momentum_buffer: optax.Updates


def _matmul(x: jax.Array, y: jax.Array) -> jax.Array:
    # Full float32 products on every backend (no TF32 / bf16 passes on accelerators).
    return jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST)


def orthogonalize(matrix: jax.Array, steps: int = 5) -> jax.Array:
    """The quintic Newton-Schulz approximation of ``U V^T`` for ``matrix = U S V^T``.

    ``X = M / (||M||_F + 1e-7)``, transposed when ``M`` has more rows than columns, then
    ``steps`` times ``A = X X^T``, ``X = a X + (b A + c A A) X`` with
    ``(a, b, c) = (3.4445, -4.7750, 2.0315)``, transposed back. The result's singular
    values lie roughly in [0.7, 1.2] rather than at 1 (the coefficients trade exactness
    for speed, as published). Computed in the matrix's dtype, at full matmul precision.
    """
    if jnp.ndim(matrix) != 2:
        raise ConfigError(f"orthogonalize needs a matrix, got shape {jnp.shape(matrix)}")
    a, b, c = NS_COEFFICIENTS
    tall = matrix.shape[0] > matrix.shape[1]
    x = matrix.T if tall else matrix
    x = x / (jnp.linalg.norm(x) + NS_EPS)
    for _ in range(steps):
        gram = _matmul(x, x.T)
        x = a * x + _matmul(b * gram + c * _matmul(gram, gram), x)
    return x.T if tall else x


def _direction(update: jax.Array, steps: int) -> jax.Array:
    """The orthogonalized, shape-scaled update of a matrix; other updates unchanged."""
    if jnp.ndim(update) < 2:
        return update
    matrix = update.reshape(update.shape[0], -1)
    rows, cols = matrix.shape
    scale = math.sqrt(max(1.0, rows / cols))
    return (orthogonalize(matrix, steps) * scale).reshape(update.shape)


def scale_by_muon(
    momentum: ArrayLike = 0.95, *, nesterov: bool = True, ns_steps: int = 5
) -> optax.GradientTransformation:
    """Muon's direction: momentum, Nesterov blend, Newton-Schulz orthogonalization.

    ``buf = momentum * buf + g``; ``u = g + momentum * buf`` with ``nesterov``, else
    ``buf``; a matrix's update is ``orthogonalize(u) * sqrt(max(1, rows / cols))``
    (a higher-dimensional one as ``(shape[0], -1)``); a 0-D or 1-D update stays ``u``.
    """

    def init_fn(params):
        return MuonState(jnp.zeros((), jnp.int32), zeros(params))

    def update_fn(updates, state, params=None):
        del params
        buf = jax.tree.map(lambda b, g: momentum * b + g, state.momentum_buffer, updates)
        blended = jax.tree.map(lambda g, b: g + momentum * b, updates, buf) if nesterov else buf
        out = jax.tree.map(lambda u: _direction(u, ns_steps), blended)
        return out, MuonState(optax.safe_increment(state.count), buf)

    return optax.GradientTransformation(init_fn, update_fn)


def check_ns_steps(ns_steps: int) -> int:
    """``ns_steps`` as a Python int in [0, 100) (it fixes the graph's iteration count)."""
    if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or not 0 <= ns_steps < 100:
        raise ConfigError(
            f"Invalid ns_steps value: {ns_steps!r} (expected an integer 0 <= ns_steps < 100; "
            "5 is the published choice)"
        )
    return ns_steps


def muon(learning_rate: ArrayLike = 0.02, momentum: ArrayLike = 0.95,
         weight_decay: ArrayLike = 0.01, *, nesterov: bool = True, ns_steps: int = 5,
) -> optax.GradientTransformation:
    """Muon: momentum orthogonalized by Newton-Schulz, with decoupled weight decay.

    Update rule (``g`` the gradient; for a matrix of ``rows x cols``)::

        buf = momentum * buf + g
        u = g + momentum * buf                      # buf without nesterov
        o = NS_ns_steps(u) * sqrt(max(1, rows / cols))
        p = p * (1 - learning_rate * weight_decay)  # decoupled weight decay
        p = p - learning_rate * o

    ``NS`` is :func:`orthogonalize`. A 0-D or 1-D parameter takes ``o = u`` (momentum
    SGD); one with more dimensions is orthogonalized as ``(shape[0], -1)``. This is
    ``torch.optim.Muon`` with ``adjust_lr_fn="original"``, except that the iteration
    runs in the parameter's dtype (float32) where torch's runs in bfloat16.
    """
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("momentum", momentum)
    check_non_negative("weight_decay", weight_decay)
    return optax.chain(
        scale_by_muon(momentum, nesterov=nesterov, ns_steps=check_ns_steps(ns_steps)),
        scale_by_learning_rate(learning_rate),
        add_decoupled_weight_decay(learning_rate, weight_decay),
    )
