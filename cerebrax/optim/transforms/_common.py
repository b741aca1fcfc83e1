"""Small pieces shared by the optimizer transformations.

Hyperparameter checks, the ``maximize`` and learning-rate steps every optimizer chains,
and the numerics helpers of the ``scale_by_torch_*`` transforms: scalars that torch
derives from the step count in double precision (bias corrections) are evaluated in
float32 in forms that avoid cancellation, and products that torch rounds before adding
them are kept apart from XLA's fused multiply-adds, so results stay within a few ulps
of torch's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from ...errors import ConfigError

ScalarOrSchedule = ArrayLike | Callable[[jax.Array], ArrayLike]


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


def is_concrete(x: object) -> bool:
    return not (isinstance(x, jax.core.Tracer) or callable(x))


def at(value: ScalarOrSchedule, count: jax.Array) -> jax.Array:
    """A hyperparameter's value at step ``count`` (schedules are called)."""
    return jnp.asarray(value(count) if callable(value) else value, jnp.float32)


def static_float(name: str, value: ArrayLike) -> float:
    """A hyperparameter that must be known when the transformation is built."""
    if isinstance(value, jax.core.Tracer):
        raise ConfigError(
            f"{name} must be a Python number (it fixes constants of the compiled step), "
            f"got a traced value; pass {name} as a float"
        )
    return float(value)


def zeros(params: optax.Params) -> optax.Updates:
    # A fresh buffer per moment: a donated state must not alias itself.
    return jax.tree.map(jnp.zeros_like, params)


def full(params: optax.Params, value: ArrayLike) -> optax.Updates:
    return jax.tree.map(lambda p: jnp.full_like(p, value), params)


def bias_correction(beta: ArrayLike, t: jax.Array) -> jax.Array:
    """``1 - beta ** t`` for ``t >= 1``, also for ``beta == 0`` (where it is 1)."""
    if isinstance(beta, (int, float)) and float(beta) == 0.0:
        return jnp.ones_like(t)
    return one_minus_power(beta, t)


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


def update_second_moment(v: jax.Array, g: jax.Array, b2: ArrayLike, one_minus_b2) -> jax.Array:
    """torch's ``v.mul_(b2).addcmul_(g, g, value=1 - b2)``.

    torch rounds ``v * b2``, then adds ``((1 - b2) * g) * g`` with one fused
    multiply-add; :func:`_times` keeps XLA from fusing ``v * b2`` instead.
    """
    return _times(v, b2) + (one_minus_b2 * g) * g


def rounded(x: jax.Array) -> jax.Array:
    """``x``, kept as its own rounded value: XLA may not fold it into the next op.

    torch rounds ``p * decay`` before adding to it and divides by a rounded
    ``sqrt(v)``; XLA would fuse such a multiply into the following add (one FMA, one
    rounding) and turn ``a / sqrt(v)`` into ``a * rsqrt(v)`` (a few ulps off). The
    select, an identity, keeps the operation apart.
    """
    return jnp.where(x == x, x, jnp.nan)
