"""Float32-accurate primitives of the closed-form schedules.

The step is an exact int32; these helpers turn integer work and Python-double
constants into float32 values without avoidable rounding (see each docstring).
Everything that can be done on the step exactly (``t // step_size``, ``t mod period``,
``T - t``) is done in int32 before it becomes a float, constants are computed in Python
double precision, and the formulas avoid cancellation:

- a blend ``end + (init - end) * w`` is written ``init * w + end * (1 - w)`` with both
  weights computed directly (``(T - t) / T`` and ``t / T``; ``sin(pi (T - t) / 2T)**2``
  and ``sin(pi t / 2T)**2`` for ``(1 +- cos(pi t / T)) / 2``), so a warmup from 0
  and a decay to 0 are both accurate to a few ulps;
- ``rate ** k`` for an integer ``k`` splits ``k * log(rate)`` into parts that are exact
  in float32 (:func:`exp_times`), so ``0.999 ** 2000`` keeps float32 precision.

Every schedule is finite at ``step = 2**31 - 1``, the counter's saturation value.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from ._checks import INT32_MAX


def count(step: ArrayLike) -> jax.Array:
    return jnp.asarray(step).astype(jnp.int32)


def to_float(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float32)


def split_hi_lo(value: float) -> tuple[float, float]:
    """``value = hi + lo`` where ``hi`` has 12 significant bits, so ``hi * n`` is exact
    in float32 for any integer ``n < 2**12``."""
    if value == 0.0:
        return 0.0, 0.0
    mantissa, exponent = math.frexp(value)
    hi = math.ldexp(round(mantissa * 4096), exponent - 12)
    return hi, float(np.float32(value - hi))


def exp_times(k: jax.Array, rate: float) -> jax.Array:
    """``exp(k * rate)`` for an int32 ``k``, within a few float32 ulps for ``k < 2**24``.

    ``k * rate`` rounded to float32 would carry an absolute error of ``|k rate| 2**-24``
    into the exponent (a relative error of ~1e-6 in the result at ``|k rate| = 10``).
    Writing ``k = k_hi + k_lo`` (``k_lo = k mod 4096``) and ``rate = hi + lo``, the
    products ``k_hi * hi`` and ``k_lo * hi`` are exact and ``k * lo`` is 4096 times
    smaller than the total, so ``exp`` sees exact or tiny arguments.
    """
    hi, lo = split_hi_lo(rate)
    k_lo = k & 4095
    value = (jnp.exp(to_float(k - k_lo) * hi) * jnp.exp(to_float(k_lo) * hi)
             * jnp.exp(to_float(k) * lo))
    approx = to_float(k) * rate
    # Past float32's range the parts could be inf * 0; the limits are exact there.
    return jnp.where(approx < -104.0, 0.0, jnp.where(approx > 88.8, jnp.inf, value))


def power(base: float, k: jax.Array) -> jax.Array:
    """``base ** k`` for a Python ``base >= 0`` and an int32 exponent ``k >= 0``."""
    if base == 0.0:
        return jnp.where(k == 0, 1.0, 0.0).astype(jnp.float32)
    return exp_times(k, math.log(base))


def mod(t: jax.Array, n: int) -> jax.Array:
    return t if n > INT32_MAX else t % n


def cosine_blend(start: float, end: float, elapsed: jax.Array, remaining: jax.Array,
                  half_pi_over_length: ArrayLike) -> jax.Array:
    """``end + (start - end) (1 + cos(pi elapsed / L)) / 2`` with ``elapsed + remaining = L``,
    as ``start sin(pi remaining / 2L)**2 + end sin(pi elapsed / 2L)**2`` (no cancellation)."""
    w_start = jnp.sin(remaining * half_pi_over_length) ** 2
    w_end = jnp.sin(elapsed * half_pi_over_length) ** 2
    return start * w_start + end * w_end
