"""Adam, Adamax, NAdam and RAdam with torch.optim numerics, as pure optax transformations.

Scalars that torch derives from the step count in double precision (bias corrections,
NAdam's momentum schedule, RAdam's rectification) are evaluated here in float32 in
forms that avoid cancellation, so they stay within a few ulps of torch's values.
Where torch rounds a product before adding it (``v.mul_(b2)``, ``p.mul_(1 - lr * wd)``)
the product is written so that XLA's fused multiply-adds round it too; the moments
then match torch's bit for bit on CPU.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from ...errors import ConfigError
from ._adam import scale_by_torch_adam
from ._common import (
    check_in_unit_interval,
    check_non_negative,
    lerp,
    maybe_negate,
    one_minus,
    one_minus_power,
    scale_by_learning_rate,
)

__all__ = [
    "TorchAdamaxState",
    "TorchNAdamState",
    "TorchRAdamState",
    "adam",
    "adamax",
    "add_decoupled_weight_decay",
    "nadam",
    "radam",
    "scale_by_torch_adamax",
    "scale_by_torch_nadam",
    "scale_by_torch_radam",
]


class TorchAdamaxState(NamedTuple):
    """State of :func:`scale_by_torch_adamax`, in torch's terms."""

    count: jax.Array  # int32: torch's state["step"]
    exp_avg: optax.Updates
    exp_inf: optax.Updates


class TorchNAdamState(NamedTuple):
    """State of :func:`scale_by_torch_nadam`, in torch's terms."""

    count: jax.Array  # int32: torch's state["step"]
    mu_product: jax.Array  # float32 scalar: the product of the momentum schedule
    exp_avg: optax.Updates
    exp_avg_sq: optax.Updates


class TorchRAdamState(NamedTuple):
    """State of :func:`scale_by_torch_radam`, in torch's terms."""

    count: jax.Array  # int32: torch's state["step"]
    exp_avg: optax.Updates
    exp_avg_sq: optax.Updates


def _zeros(params: optax.Params) -> optax.Updates:
    # A fresh buffer per moment: a donated state must not alias itself.
    return jax.tree.map(jnp.zeros_like, params)


def _bias_correction(beta: ArrayLike, t: jax.Array) -> jax.Array:
    """``1 - beta ** t`` for ``t >= 1``, also for ``beta == 0`` (where it is 1)."""
    if isinstance(beta, (int, float)) and float(beta) == 0.0:
        return jnp.ones_like(t)
    return one_minus_power(beta, t)


def _static_float(name: str, value: ArrayLike) -> float:
    """A hyperparameter that must be known when the transformation is built."""
    if isinstance(value, jax.core.Tracer):
        raise ConfigError(
            f"{name} must be a Python number (it fixes constants of the compiled step), "
            f"got a traced value; pass {name} as a float"
        )
    return float(value)


def _times(v: jax.Array, b: ArrayLike) -> jax.Array:
    """``v * b`` rounded once, also where a compiler fuses it into a following add.

    For ``b >= 0.5``, ``1 - b`` is exact in float32 and ``v - v * (1 - b)`` is ``v * b``
    rounded once, fused or not; a plain ``v * b`` would be fused into the next
    addition, which then skips the rounding torch does in ``v.mul_(b)``.
    """
    if isinstance(b, (int, float)):
        if float(b) < 0.5:
            return v * b
        return v - v * (1.0 - float(np.float32(b)))
    b = jnp.asarray(b, jnp.float32)
    return jnp.where(b < 0.5, v * b, v - v * (1.0 - b))


def _update_second_moment(v: jax.Array, g: jax.Array, b2: ArrayLike, one_minus_b2) -> jax.Array:
    """torch's ``v.mul_(b2).addcmul_(g, g, value=1 - b2)``.

    torch rounds ``v * b2``, then adds ``((1 - b2) * g) * g`` with one fused
    multiply-add; :func:`_times` keeps XLA from fusing ``v * b2`` instead.
    """
    return _times(v, b2) + (one_minus_b2 * g) * g


# ---- Adamax ----------------------------------------------------------------------------


def scale_by_torch_adamax(
    b1: ArrayLike = 0.9, b2: ArrayLike = 0.999, eps: ArrayLike = 1e-8
) -> optax.GradientTransformation:
    """Rescales updates with torch's Adamax moments.

    ``m = lerp(m, g, 1 - b1)``; ``u = max(b2 * u, |g| + eps)``; the update is
    ``m / u / (1 - b1^t)``.
    """

    one_minus_b1 = one_minus(b1)

    def init_fn(params):
        return TorchAdamaxState(jnp.zeros((), jnp.int32), _zeros(params), _zeros(params))

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        m = jax.tree.map(lambda m, g: lerp(m, g, one_minus_b1), state.exp_avg, updates)
        u = jax.tree.map(lambda u, g: jnp.maximum(u * b2, jnp.abs(g) + eps), state.exp_inf, updates)
        bc1 = _bias_correction(b1, count.astype(jnp.float32))
        out = jax.tree.map(lambda m, u: (m / u) / bc1, m, u)
        return out, TorchAdamaxState(count, m, u)

    return optax.GradientTransformation(init_fn, update_fn)


# ---- NAdam -----------------------------------------------------------------------------


def _nadam_momentum(b1: ArrayLike, log_decay: float, t: jax.Array):
    """``(mu_t, 1 - mu_t)`` with ``mu_t = b1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))``.

    With ``e = expm1(t * momentum_decay * log(0.96))``, ``mu_t = b1/2 - b1/2 * e`` and
    ``1 - mu_t = (1 - b1/2) + b1/2 * e``. For a Python ``b1``, ``b1/2 = hi + lo`` is split
    into a float32 head and the rest, so the small terms are summed first and ``mu_t``
    is rounded once: it is then float32(torch's double ``mu_t``) nearly always, and the
    float32 ``mu_product`` (which torch keeps) does not drift.
    """
    e = jnp.expm1(t * log_decay)
    if not isinstance(b1, (int, float)):
        half = 0.5 * b1
        return half - half * e, (1.0 - half) + half * e
    half = 0.5 * float(b1)
    hi = float(np.float32(half))
    # The barrier keeps XLA from folding ``hi + (lo - x)`` into ``(hi + lo) - x``.
    small = jax.lax.optimization_barrier((half - hi) - hi * e)
    return hi + small, (1.0 - half) + hi * e


def scale_by_torch_nadam(
    b1: ArrayLike = 0.9,
    b2: ArrayLike = 0.999,
    eps: ArrayLike = 1e-8,
    momentum_decay: float = 4e-3,
) -> optax.GradientTransformation:
    """Rescales updates with torch's NAdam moments and momentum schedule.

    With ``mu_t = b1 * (1 - 0.5 * 0.96^(t * momentum_decay))`` and
    ``P_t = mu_1 * ... * mu_t`` (``mu_product``, kept in float32 as torch does)::

        m = lerp(m, g, 1 - b1);  v = b2 * v + (1 - b2) * g^2
        d = sqrt(v / (1 - b2^t)) + eps
        update = (1 - mu_t) / (1 - P_t) * g / d + mu_{t+1} / (1 - P_t * mu_{t+1}) * m / d
    """

    log_decay = _static_float("momentum_decay", momentum_decay) * math.log(0.96)
    one_minus_b1, one_minus_b2 = one_minus(b1), one_minus(b2)

    def init_fn(params):
        return TorchNAdamState(
            jnp.zeros((), jnp.int32), jnp.ones((), jnp.float32), _zeros(params), _zeros(params)
        )

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        mu, one_minus_mu = _nadam_momentum(b1, log_decay, t)
        mu_next, _ = _nadam_momentum(b1, log_decay, t + 1.0)
        mu_product = state.mu_product * mu
        grad_coef = one_minus_mu / (1.0 - mu_product)
        avg_coef = mu_next / (1.0 - mu_product * mu_next)
        m = jax.tree.map(lambda m, g: lerp(m, g, one_minus_b1), state.exp_avg, updates)
        v = jax.tree.map(
            lambda v, g: _update_second_moment(v, g, b2, one_minus_b2), state.exp_avg_sq, updates
        )
        bc2 = _bias_correction(b2, t)
        out = jax.tree.map(
            lambda g, m, v: _nadam_direction(g, m, jnp.sqrt(v / bc2) + eps, grad_coef, avg_coef),
            updates,
            m,
            v,
        )
        return out, TorchNAdamState(count, mu_product, m, v)

    return optax.GradientTransformation(init_fn, update_fn)


def _nadam_direction(g, m, denom, grad_coef, avg_coef):
    return (grad_coef * g) / denom + (avg_coef * m) / denom


# ---- RAdam -----------------------------------------------------------------------------


def _one_minus_x_over_expm1(x: jax.Array) -> jax.Array:
    """``1 - x / (e^x - 1)`` for ``x > 0``, without cancellation near 0.

    Below 1 it is ``(e^x - 1 - x) / (e^x - 1)`` with the numerator from its Taylor
    series ``x^2/2 * sum_j 2 x^j / (j + 2)!`` (truncation below float32 precision).
    """
    small = jnp.minimum(x, 1.0)
    series = jnp.zeros_like(small)
    for j in range(11, -1, -1):
        series = series * small + 2.0 / math.factorial(j + 2)
    near_zero = (0.5 * small * small * series) / jnp.expm1(small)
    return jnp.where(x < 1.0, near_zero, 1.0 - x / jnp.expm1(x))


class _RAdamConstants(NamedTuple):
    log_b2: float  # -log(b2) > 0
    rho_offset: float  # rho_inf - 2 / log_b2
    rect_scale: float  # rho_inf / ((rho_inf - 4) * (rho_inf - 2))
    first_rectified_step: int  # the first step with rho_t > 5 (2**31 - 1: never)


def _rho(b2: float, t: int) -> float:
    """torch's ``rho_t``, in double precision."""
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    return rho_inf - 2.0 * t * b2**t / (1.0 - b2**t)


def _radam_constants(b2: float) -> _RAdamConstants:
    never = 2**31 - 1
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    if b2 == 0.0 or rho_inf <= 5.0:  # rho_t < rho_inf: the rectified branch never runs
        return _RAdamConstants(1.0, 0.0, 0.0, never)
    first = 1
    while _rho(b2, first) <= 5.0:  # rho_t increases towards rho_inf > 5
        first += 1
    log_b2 = -math.log(b2)
    return _RAdamConstants(
        log_b2, rho_inf - 2.0 / log_b2, rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0)), first
    )


def scale_by_torch_radam(
    b1: ArrayLike = 0.9, b2: float = 0.999, eps: ArrayLike = 1e-8
) -> optax.GradientTransformation:
    """Rescales updates with torch's RAdam moments and variance rectification.

    ``m = lerp(m, g, 1 - b1)``; ``v = b2 * v + (1 - b2) * g^2``;
    ``rho_inf = 2 / (1 - b2) - 1``; ``rho_t = rho_inf - 2 t b2^t / (1 - b2^t)``. The
    update is ``m / (1 - b1^t)`` times, when ``rho_t > 5``,
    ``sqrt(1 - b2^t) / (sqrt(v) + eps) * r_t`` with
    ``r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))``.

    ``b2`` is a Python number: the first rectified step is found in double precision
    when the transformation is built, so the branch switches at torch's step.
    """

    b2 = _static_float("b2", b2)
    const = _radam_constants(b2)
    one_minus_b1, one_minus_b2 = one_minus(b1), one_minus(b2)

    def init_fn(params):
        return TorchRAdamState(jnp.zeros((), jnp.int32), _zeros(params), _zeros(params))

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        m = jax.tree.map(lambda m, g: lerp(m, g, one_minus_b1), state.exp_avg, updates)
        v = jax.tree.map(
            lambda v, g: _update_second_moment(v, g, b2, one_minus_b2), state.exp_avg_sq, updates
        )
        bc1 = _bias_correction(b1, t)
        bc2_sqrt = jnp.sqrt(_bias_correction(b2, t))
        # rho_t = rho_inf - (2 / L) * x / expm1(x) with x = t * L, L = -log(b2).
        rho = const.rho_offset + (2.0 / const.log_b2) * _one_minus_x_over_expm1(t * const.log_b2)
        rect = jnp.sqrt((rho - 4.0) * (rho - 2.0) / rho * const.rect_scale)
        rectified = count >= const.first_rectified_step

        def direction(m, v):
            corrected = m / bc1
            adaptive = bc2_sqrt / (jnp.sqrt(v) + eps)
            return jnp.where(rectified, corrected * adaptive * rect, corrected)

        return jax.tree.map(direction, m, v), TorchRAdamState(count, m, v)

    return optax.GradientTransformation(init_fn, update_fn)


# ---- the optimizers --------------------------------------------------------------------


def _check_common(learning_rate, b1, b2, eps, weight_decay) -> None:
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("epsilon", eps)
    check_non_negative("weight_decay", weight_decay)
    check_in_unit_interval("beta1", b1)
    check_in_unit_interval("beta2", b2)


def _one_minus_float32_factor(lr: ArrayLike, weight_decay: ArrayLike) -> ArrayLike:
    """``1 - f`` for the float32 factor ``f = 1 - lr * weight_decay`` (torch's rounding)."""
    if isinstance(lr, (int, float)) and isinstance(weight_decay, (int, float)):
        return 1.0 - float(np.float32(1.0 - float(lr) * float(weight_decay)))
    factor = (1.0 - jnp.asarray(lr, jnp.float32) * weight_decay).astype(jnp.float32)
    return 1.0 - factor


def add_decoupled_weight_decay(
    learning_rate: ArrayLike, weight_decay: ArrayLike
) -> optax.GradientTransformation:
    """Decays the parameters by ``1 - learning_rate * weight_decay`` before the update.

    Returns ``(p * f + u) - p`` for the incoming update ``u`` and the float32 factor
    ``f = 1 - learning_rate * weight_decay``, so that ``p + update`` is torch's
    ``p.mul_(f)`` followed by ``p.add_(u)``, rounding for rounding (the outer
    subtraction is exact): a long run does not drift from torch the way
    ``u - learning_rate * weight_decay * p`` would. ``p * f`` is written
    ``p - p * (1 - f)``: ``1 - f`` is exact, and a compiler that fuses the multiply
    into the subtraction still rounds ``p * f`` once, where fusing ``p * f + u``
    would skip torch's rounding of ``p * f``. Place it after the learning-rate
    scaling. ``learning_rate`` may be a schedule of the step.
    """
    scheduled = callable(learning_rate)

    def init_fn(params):
        del params
        if scheduled:
            return optax.ScaleByScheduleState(jnp.zeros((), jnp.int32))
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        if params is None:
            raise ConfigError(
                "add_decoupled_weight_decay needs the parameters: call "
                "tx.update(updates, state, params)"
            )
        lr = learning_rate(state.count) if scheduled else learning_rate
        shrink = _one_minus_float32_factor(lr, weight_decay)
        out = jax.tree.map(lambda u, p: ((p - p * shrink) + u) - p, updates, params)
        if scheduled:
            state = optax.ScaleByScheduleState(optax.safe_increment(state.count))
        return out, state

    return optax.GradientTransformation(init_fn, update_fn)


def _with_weight_decay(
    scale_by: optax.GradientTransformation,
    learning_rate: ArrayLike,
    weight_decay: ArrayLike,
    *,
    maximize: bool,
    decoupled: bool,
) -> optax.GradientTransformation:
    """``maximize``, then L2 (``g + wd * p``) or decoupled (``p * (1 - lr * wd)``) decay.

    The ``scale_by`` state is the third entry of the chain's state for every setting.
    """
    return optax.chain(
        maybe_negate(maximize),
        optax.identity() if decoupled else optax.add_decayed_weights(weight_decay),
        scale_by,
        scale_by_learning_rate(learning_rate),
        add_decoupled_weight_decay(learning_rate, weight_decay) if decoupled else optax.identity(),
    )


def adam(
    learning_rate: ArrayLike = 1e-3,
    b1: ArrayLike = 0.9,
    b2: ArrayLike = 0.999,
    eps: ArrayLike = 1e-8,
    weight_decay: ArrayLike = 0.0,
    *,
    amsgrad: bool = False,
    maximize: bool = False,
    decoupled_weight_decay: bool = False,
) -> optax.GradientTransformation:
    """Adam, numerically as ``torch.optim.Adam``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        g = g + weight_decay * p                  # p = p * (1 - lr * weight_decay)
                                                  #   with decoupled_weight_decay
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g^2               # v_max = max(v_max, v) (amsgrad)
        p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    Example:
      >>> tx = adam(1e-3)
      >>> params = {"w": jnp.ones(2)}
      >>> updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
      >>> optax.apply_updates(params, updates)["w"]
      Array([0.999, 0.999], dtype=float32)
    """
    _check_common(learning_rate, b1, b2, eps, weight_decay)
    return _with_weight_decay(
        scale_by_torch_adam(b1, b2, eps, amsgrad=amsgrad),
        learning_rate,
        weight_decay,
        maximize=maximize,
        decoupled=decoupled_weight_decay,
    )


def adamax(
    learning_rate: ArrayLike = 2e-3,
    b1: ArrayLike = 0.9,
    b2: ArrayLike = 0.999,
    eps: ArrayLike = 1e-8,
    weight_decay: ArrayLike = 0.0,
    *,
    maximize: bool = False,
) -> optax.GradientTransformation:
    """Adamax (Adam in the infinity norm), numerically as ``torch.optim.Adamax``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        u = max(b2 * u, |g| + eps)
        p = p - lr / (1 - b1^t) * m / u

    Example:
      >>> tx = adamax(2e-3)
      >>> params = {"w": jnp.ones(2)}
      >>> updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
      >>> optax.apply_updates(params, updates)["w"]
      Array([0.998, 0.998], dtype=float32)
    """
    _check_common(learning_rate, b1, b2, eps, weight_decay)
    return _with_weight_decay(
        scale_by_torch_adamax(b1, b2, eps),
        learning_rate,
        weight_decay,
        maximize=maximize,
        decoupled=False,
    )


def nadam(
    learning_rate: ArrayLike = 2e-3,
    b1: ArrayLike = 0.9,
    b2: ArrayLike = 0.999,
    eps: ArrayLike = 1e-8,
    weight_decay: ArrayLike = 0.0,
    momentum_decay: float = 4e-3,
    *,
    maximize: bool = False,
    decoupled_weight_decay: bool = False,
) -> optax.GradientTransformation:
    """NAdam (Adam with Nesterov momentum), numerically as ``torch.optim.NAdam``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        g = g + weight_decay * p                  # p = p * (1 - lr * weight_decay)
                                                  #   with decoupled_weight_decay
        mu_t = b1 * (1 - 0.5 * 0.96^(t * momentum_decay));  P_t = mu_1 * ... * mu_t
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g^2
        d = sqrt(v / (1 - b2^t)) + eps
        p = p - lr * (1 - mu_t) / (1 - P_t) * g / d
              - lr * mu_{t+1} / (1 - P_t * mu_{t+1}) * m / d

    Example:
      >>> tx = nadam(2e-3)
      >>> params = {"w": jnp.ones(2)}
      >>> updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
      >>> optax.apply_updates(params, updates)["w"]
      Array([0.9978871, 0.9978871], dtype=float32)
    """
    _check_common(learning_rate, b1, b2, eps, weight_decay)
    check_non_negative("momentum_decay", momentum_decay)
    return _with_weight_decay(
        scale_by_torch_nadam(b1, b2, eps, momentum_decay),
        learning_rate,
        weight_decay,
        maximize=maximize,
        decoupled=decoupled_weight_decay,
    )


def radam(
    learning_rate: ArrayLike = 1e-3,
    b1: ArrayLike = 0.9,
    b2: float = 0.999,
    eps: ArrayLike = 1e-8,
    weight_decay: ArrayLike = 0.0,
    *,
    maximize: bool = False,
    decoupled_weight_decay: bool = False,
) -> optax.GradientTransformation:
    """RAdam (rectified Adam), numerically as ``torch.optim.RAdam``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        g = g + weight_decay * p                  # p = p * (1 - lr * weight_decay)
                                                  #   with decoupled_weight_decay
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g^2
        rho_inf = 2 / (1 - b2) - 1;  rho_t = rho_inf - 2 t b2^t / (1 - b2^t)
        p = p - lr * m / (1 - b1^t) * sqrt(1 - b2^t) / (sqrt(v) + eps) * r_t  if rho_t > 5
        p = p - lr * m / (1 - b1^t)                                            otherwise
        r_t = sqrt((rho_t - 4) (rho_t - 2) rho_inf / ((rho_inf - 4) (rho_inf - 2) rho_t))

    ``b2`` must be a Python number (see :func:`scale_by_torch_radam`).

    Example:
      >>> tx = radam(1e-3)
      >>> params = {"w": jnp.ones(2)}
      >>> updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
      >>> optax.apply_updates(params, updates)["w"]
      Array([0.999, 0.999], dtype=float32)
    """
    _check_common(learning_rate, b1, b2, eps, weight_decay)
    return _with_weight_decay(
        scale_by_torch_radam(b1, b2, eps),
        learning_rate,
        weight_decay,
        maximize=maximize,
        decoupled=decoupled_weight_decay,
    )
