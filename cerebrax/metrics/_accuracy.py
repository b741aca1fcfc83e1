"""``AccuracyMetric``: the (weighted) fraction of predictions equal to their labels."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._base import Metric, as_float, divide_no_nan

__all__ = ["AccuracyMetric"]


class AccuracyMetric(Metric):
    """Accuracy over every batch since the last reset.

    ``update(labels, predictions, weights=None)`` adds ``sum(w * [label == pred])`` to the
    correct count and ``numel(labels)`` (or, with weights, ``sum([w > 0])``) to the total;
    the value is their ratio.

    Example:
      >>> accuracy = cstorch.metrics.AccuracyMetric("accuracy")
      >>> accuracy.update(labels=jnp.array([1, 2, 3]), predictions=jnp.array([1, 2, 0]))
      >>> round(float(accuracy), 4)
      0.6667
    """

    def _initial_state(self) -> dict[str, jax.Array]:
        return {"total_correct": jnp.float32(0), "total_count": jnp.float32(0)}

    def _update(
        self, state, labels: Any, predictions: Any, weights: Any = None
    ) -> dict[str, jax.Array]:
        labels, predictions = jnp.asarray(labels), jnp.asarray(predictions)
        correct = as_float(labels == predictions)
        if weights is None:
            count = jnp.float32(labels.size)
        else:
            weights = as_float(weights)
            correct = correct * weights
            count = jnp.sum(as_float(weights > 0))
        return {
            "total_correct": state["total_correct"] + jnp.sum(correct),
            "total_count": state["total_count"] + count,
        }

    def _compute(self, state) -> jax.Array:
        return divide_no_nan(state["total_correct"], state["total_count"])
