"""Adafactor with torch.optim.Adafactor numerics, as a pure optax transformation."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ...errors import ConfigError
from ._common import check_non_negative, lerp, maybe_negate

__all__ = [
    "RelativeStepState",
    "TorchAdafactorState",
    "adafactor",
    "scale_by_relative_step",
    "scale_by_torch_factored_rms",
]


class TorchAdafactorState(NamedTuple):
    """State of :func:`scale_by_torch_factored_rms`, in torch's terms.

    A parameter with two or more dimensions has ``row_var`` (its shape with the last
    dimension 1) and ``col_var`` (its shape with the second-to-last dimension 1) and an
    empty ``variance``; any other parameter has a ``variance`` of its own shape and
    empty row and column factors. Empty entries are ``()``.
    """

    count: jax.Array  # int32: torch's state["step"]
    row_var: optax.Updates
    col_var: optax.Updates
    variance: optax.Updates


class RelativeStepState(NamedTuple):
    """State of :func:`scale_by_relative_step`."""

    count: jax.Array  # int32: steps taken; the step size is capped at 1 / sqrt(count)


def _factored(x: jax.Array) -> bool:
    return jnp.ndim(x) > 1


def _reduced_zeros(x: jax.Array, axis: int) -> jax.Array:
    shape = list(jnp.shape(x))
    shape[axis] = 1
    return jnp.zeros(shape, x.dtype)


def _eps1_of(eps1: float | None, x: jax.Array) -> float:
    return float(jnp.finfo(x.dtype).eps) if eps1 is None else float(eps1)


def _rms(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.mean(jnp.square(x)))


def scale_by_torch_factored_rms(
    beta2_decay: ArrayLike = -0.8,
    eps1: float | None = None,
    d: ArrayLike = 1.0,
) -> optax.GradientTransformation:
    """torch's Adafactor direction: the gradient over a factored RMS, then clipped.

    With ``t`` the step and ``w = t ** beta2_decay`` (so ``beta2_t = 1 - w``), for a
    parameter with two or more dimensions (factored over the last two)::

        row_var = lerp(row_var, mean(g^2, axis=-1), w)
        col_var = lerp(col_var, mean(g^2, axis=-2), w)
        v = row_var * col_var / max(mean(row_var, axis=-2), eps1)

    and ``v = lerp(v, g^2, w)`` for any other parameter. The update is
    ``u = g / sqrt(max(v, eps1^2))`` divided by ``max(1, rms(u) / d)``. ``eps1=None``
    means the machine epsilon of each parameter's dtype.
    """

    def init_fn(params):
        leaves, treedef = jax.tree.flatten(params)

        def factor(axis):
            return treedef.unflatten(
                [_reduced_zeros(p, axis) if _factored(p) else () for p in leaves]
            )

        variance = treedef.unflatten(
            [() if _factored(p) else jnp.zeros_like(p) for p in leaves]
        )
        return TorchAdafactorState(jnp.zeros((), jnp.int32), factor(-1), factor(-2), variance)

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        weight = jnp.power(count.astype(jnp.float32), beta2_decay)
        g_leaves, treedef = jax.tree.flatten(updates)
        is_leaf = lambda x: isinstance(x, tuple) and not x  # noqa: E731
        rows = jax.tree.leaves(state.row_var, is_leaf=is_leaf)
        cols = jax.tree.leaves(state.col_var, is_leaf=is_leaf)
        variances = jax.tree.leaves(state.variance, is_leaf=is_leaf)
        out, new_rows, new_cols, new_variances = [], [], [], []
        for g, row, col, variance in zip(g_leaves, rows, cols, variances):
            eps1_g = _eps1_of(eps1, g)
            g2 = jnp.square(g)
            if _factored(g):
                row = lerp(row, jnp.mean(g2, axis=-1, keepdims=True), weight)
                col = lerp(col, jnp.mean(g2, axis=-2, keepdims=True), weight)
                row_mean = jnp.maximum(jnp.mean(row, axis=-2, keepdims=True), eps1_g)
                v = row * col / row_mean
            else:
                v = variance = lerp(variance, g2, weight)
            u = jax.lax.rsqrt(jnp.maximum(v, eps1_g * eps1_g)) * g
            u = u / jnp.maximum(1.0, _rms(u) / d)
            out.append(u)
            new_rows.append(row)
            new_cols.append(col)
            new_variances.append(variance)
        new_state = TorchAdafactorState(
            count,
            treedef.unflatten(new_rows),
            treedef.unflatten(new_cols),
            treedef.unflatten(new_variances),
        )
        return treedef.unflatten(out), new_state

    return optax.GradientTransformation(init_fn, update_fn)


def scale_by_relative_step(
    learning_rate: ArrayLike = 1e-2, eps2: ArrayLike = 1e-3
) -> optax.GradientTransformation:
    """Scales each parameter's update by ``min(learning_rate, 1 / sqrt(t)) * max(eps2, rms(p))``.

    ``rms(p)`` is the root mean square of the parameter before this step's update.
    """

    def init_fn(params):
        del params
        return RelativeStepState(jnp.zeros((), jnp.int32))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError(optax.NO_PARAMS_MSG)
        count = optax.safe_increment(state.count)
        rho = jnp.minimum(learning_rate, jax.lax.rsqrt(count.astype(jnp.float32)))
        out = jax.tree.map(
            lambda u, p: (jnp.maximum(eps2, _rms(p)) * rho * u).astype(u.dtype), updates, params
        )
        return out, RelativeStepState(count)

    return optax.GradientTransformation(init_fn, update_fn)


def adafactor(learning_rate: ArrayLike = 1e-2, beta2_decay: ArrayLike = -0.8,
              eps1: float | None = None, eps2: ArrayLike = 1e-3, d: ArrayLike = 1.0,
              weight_decay: ArrayLike = 0.0, *, maximize: bool = False,
) -> optax.GradientTransformation:
    """Adafactor, numerically as ``torch.optim.Adafactor``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step;
    factored second moments as in :func:`scale_by_torch_factored_rms`)::

        alpha = max(eps2, rms(p)) * min(learning_rate, 1 / sqrt(t))
        p = p * (1 - learning_rate * weight_decay)          # decoupled weight decay
        u = g / sqrt(max(v, eps1^2))                        # v: factored EMA of g^2
        p = p - alpha * u / max(1, rms(u) / d)

    Args:
      learning_rate: the cap of the relative step size and the weight-decay scale (a
        number or traced scalar; wrap the factory in ``optax.inject_hyperparams`` for a
        schedule).
      beta2_decay: ``beta2_t = 1 - t ** beta2_decay`` (<= 0).
      eps1: floor of the factored row mean and, squared, of ``v``; ``None`` means the
        machine epsilon of each parameter's dtype.
      eps2: floor of the parameter RMS that scales the step.
      d: clipping threshold of the update's RMS (>= 1).
      weight_decay: decoupled weight decay, scaled by ``learning_rate``.
      maximize: maximize the objective instead of minimizing it.
    """
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("epsilon2", eps2)
    check_non_negative("weight_decay", weight_decay)
    if eps1 is not None:
        check_non_negative("epsilon1", eps1)
    if callable(learning_rate):
        raise ConfigError(
            "adafactor(learning_rate=<schedule>): the learning rate appears twice in the "
            "update; use optax.inject_hyperparams(adafactor)(learning_rate=schedule)"
        )
    if not isinstance(beta2_decay, jax.core.Tracer) and not float(beta2_decay) <= 0.0:
        raise ConfigError(f"Invalid beta2_decay value: {beta2_decay!r} (expected <= 0)")
    if not isinstance(d, jax.core.Tracer) and not float(d) >= 1.0:
        raise ConfigError(f"Invalid clipping threshold d: {d!r} (expected >= 1)")
    return optax.chain(
        maybe_negate(maximize),
        scale_by_torch_factored_rms(beta2_decay, eps1, d),
        scale_by_relative_step(learning_rate, eps2),
        optax.add_decayed_weights(learning_rate * weight_decay),
        optax.scale(-1.0),
    )
