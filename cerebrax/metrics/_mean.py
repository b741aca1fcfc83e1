"""``MeanMetric``: the weighted mean of a stream of values."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._base import Metric, as_float, divide_no_nan
from ._checks import broadcast_weights

__all__ = ["MeanMetric"]


class MeanMetric(Metric):
    """Weighted mean of every value since the last reset.

    ``update(value, weight=1.0)`` broadcasts ``weight`` to the shape of ``value`` and
    adds ``sum(value * weight)`` and ``sum(weight)`` to the totals; the value is their
    ratio (0 while the total weight is 0). A scalar ``weight`` thus counts every element
    of ``value`` with that weight.

    Example:
      >>> mean = cstorch.metrics.MeanMetric("loss")
      >>> mean.update(jnp.array([1.0, 2.0]))
      >>> mean.update(4.0, weight=2.0)
      >>> round(float(mean), 4)  # (1 + 2 + 2 * 4) / (1 + 1 + 2)
      2.75
    """

    def _initial_state(self) -> dict[str, jax.Array]:
        return {"weighted_sum": jnp.float32(0), "total_weight": jnp.float32(0)}

    def _update(self, state, value: Any, weight: Any = 1.0) -> dict[str, jax.Array]:
        value = as_float(value)
        weight = broadcast_weights(type(self).__name__, weight, value.shape, arg="weight")
        return {
            "weighted_sum": state["weighted_sum"] + jnp.sum(value * weight),
            "total_weight": state["total_weight"] + jnp.sum(weight),
        }

    def _compute(self, state) -> jax.Array:
        return divide_no_nan(state["weighted_sum"], state["total_weight"])
