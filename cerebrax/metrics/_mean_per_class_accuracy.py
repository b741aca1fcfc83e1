"""``MeanPerClassAccuracyMetric``: the accuracy of each class, averaged over classes."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._base import Metric, divide_no_nan
from ._checks import batch_weights, check_num_classes

__all__ = ["MeanPerClassAccuracyMetric"]


class MeanPerClassAccuracyMetric(Metric):
    """Per-class accuracy averaged over all ``num_classes`` classes.

    ``update(labels, predictions, weights=None)`` adds, for each class ``c``,
    ``sum(w * [label == c] * [pred == c])`` to ``correct[c]`` and
    ``sum(w * [label == c])`` to ``count[c]`` (weights default to 1 and broadcast to the
    labels' shape; labels outside ``[0, num_classes)`` are dropped). The value is
    ``mean_c(correct[c] / count[c])`` over every class, where a class never labelled
    counts as 0.

    Args:
      num_classes: the number of classes (at least 1).
      name: the metric's name (default ``"MeanPerClassAccuracyMetric"``).

    Example:
      >>> mpca = cstorch.metrics.MeanPerClassAccuracyMetric(num_classes=2)
      >>> mpca.update(labels=jnp.array([0, 0, 0, 1]), predictions=jnp.array([0, 0, 1, 1]))
      >>> round(float(mpca), 4)  # (2/3 + 1) / 2
      0.8333
    """

    def __init__(self, num_classes: int, name: str | None = None):
        metric = type(self).__name__
        self.num_classes = check_num_classes(metric, num_classes, minimum=1)
        super().__init__(name)

    def _initial_state(self) -> dict[str, jax.Array]:
        zeros = jnp.zeros(self.num_classes, jnp.float32)
        return {"correct": zeros, "count": zeros}

    def _update(
        self, state, labels: Any, predictions: Any, weights: Any = None
    ) -> dict[str, jax.Array]:
        labels, predictions = jnp.asarray(labels), jnp.asarray(predictions)
        weights = batch_weights(type(self).__name__, labels, predictions, weights)
        labels = labels.astype(jnp.int32).ravel()
        in_range = (labels >= 0) & (labels < self.num_classes)
        index = jnp.where(in_range, labels, 0)
        weights = jnp.where(in_range, weights.ravel(), 0)
        correct = weights * (labels == predictions.astype(jnp.int32).ravel())
        return {
            "correct": state["correct"].at[index].add(correct),
            "count": state["count"].at[index].add(weights),
        }

    def _compute(self, state) -> jax.Array:
        return jnp.mean(divide_no_nan(state["correct"], state["count"]))
