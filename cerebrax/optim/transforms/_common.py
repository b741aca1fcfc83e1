"""Small pieces shared by the optimizer transformations."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ...errors import ConfigError


def check_non_negative(name: str, value: ArrayLike) -> None:
    """Raises ConfigError for a negative concrete hyperparameter (traced ones pass)."""
    if isinstance(value, jax.core.Tracer) or callable(value):
        return  # traced values and schedules are checked where they are made
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"Invalid {name}: {value!r} is not a number") from None
    if not number >= 0.0:
        raise ConfigError(f"Invalid {name} value: {value!r} (expected >= 0)")


def check_in_unit_interval(name: str, value: ArrayLike) -> None:
    """Raises ConfigError unless ``0 <= value < 1`` (traced values pass)."""
    if isinstance(value, jax.core.Tracer):
        return
    if not 0.0 <= float(value) < 1.0:
        raise ConfigError(f"Invalid {name} parameter: {value!r} (expected 0 <= {name} < 1)")


def maybe_negate(maximize: bool) -> optax.GradientTransformation:
    """Negates the gradient when maximizing, else the identity."""
    return optax.scale(-1.0) if maximize else optax.identity()


def scale_by_learning_rate(learning_rate: ArrayLike) -> optax.GradientTransformation:
    """Scales the update by ``-learning_rate`` (a number, traced scalar or schedule)."""
    return optax.scale_by_learning_rate(learning_rate)


def _is_number(x: ArrayLike) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def one_minus(x: ArrayLike) -> ArrayLike:
    """``1 - x``, in double precision when ``x`` is a Python number (as torch computes it)."""
    return 1.0 - float(x) if _is_number(x) else 1.0 - x


def one_minus_power(base: ArrayLike, t: jax.Array) -> jax.Array:
    """``1 - base ** t`` without float32 cancellation: ``-expm1(t * log(base))``.

    torch evaluates bias corrections such as ``1 - 0.999 ** t`` in double precision;
    in float32 ``1 - 0.999`` alone is off by 5e-5. With ``log(base)`` taken in double
    and ``expm1``, the float32 result is within a few ulps of torch's.
    """
    if _is_number(base) and float(base) == 0.0:
        return jnp.ones_like(t, dtype=jnp.float32)  # 0 ** t == 0 for every step t >= 1
    log_base = math.log(float(base)) if _is_number(base) else jnp.log(base)
    return -jnp.expm1(t * log_base)


def lerp(start: jax.Array, end: jax.Array, weight: jax.Array) -> jax.Array:
    """``start + weight * (end - start)``, evaluated the way torch's ``lerp_`` does."""
    return jnp.where(
        jnp.abs(weight) < 0.5,
        start + weight * (end - start),
        end - (end - start) * (1 - weight),
    )
