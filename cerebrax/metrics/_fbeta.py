"""``FBetaScoreMetric``: the F-beta score of class predictions, micro or macro averaged."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from ._base import divide_no_nan
from ._checks import check_positive
from ._confusion import ConfusionMatrixMetric

__all__ = ["FBetaScoreMetric"]

_AVERAGE_TYPES = ("micro", "macro")


def fbeta(precision: jax.Array, recall: jax.Array, beta: float) -> jax.Array:
    """``(1 + b^2) p r / (b^2 p + r)``, and 0 where that denominator is 0."""
    b2 = beta * beta
    return divide_no_nan((1 + b2) * precision * recall, b2 * precision + recall)


class FBetaScoreMetric(ConfusionMatrixMetric):
    """F-beta score over every batch since the last reset.

    ``update(labels, predictions)`` adds the batch to the confusion matrix ``cm`` (rows
    labels, columns predictions). With ``tp = diag(cm)``, ``predicted = cm.sum(0)``,
    ``actual = cm.sum(1)``, ``m`` the mask of classes not in ``ignore_labels`` and
    ``F(p, r) = (1 + beta^2) p r / (beta^2 p + r)`` (0 where a denominator is 0):

    - ``"micro"``: ``F(sum(m tp) / sum(m predicted), sum(m tp) / sum(m actual))``;
    - ``"macro"``: ``sum(m F(tp / predicted, tp / actual)) / sum(m)``, every kept class
      counting equally, present in the data or not.

    Args:
      num_classes: the number of classes (at least 2).
      beta: the weight of recall relative to precision (positive).
      average_type: ``"micro"`` or ``"macro"``.
      ignore_labels: classes left out of the score: None, one index, or several.
      name: the metric's name (default ``"FBetaScoreMetric"``).

    Example:
      >>> f1 = cstorch.metrics.FBetaScoreMetric(num_classes=3, average_type="macro")
      >>> f1.update(labels=jnp.array([0, 1, 1, 2]), predictions=jnp.array([0, 1, 2, 2]))
      >>> round(float(f1), 4)  # (1 + 2/3 + 2/3) / 3
      0.7778
    """

    def __init__(
        self,
        num_classes: int,
        beta: float = 1.0,
        average_type: str = "micro",
        ignore_labels: Any = None,
        name: str | None = None,
    ):
        metric = type(self).__name__
        self.beta = check_positive(metric, "beta", beta)
        if average_type not in _AVERAGE_TYPES:
            raise ConfigError(
                f"{metric}: `average_type` must be one of {_AVERAGE_TYPES}, got {average_type=}."
            )
        self.average_type = average_type
        super().__init__(
            num_classes, ignore_labels, ignore_arg="ignore_labels", name=name, min_classes=2
        )

    def _update(self, state, labels: Any, predictions: Any) -> dict[str, jax.Array]:
        return super()._update(state, labels, predictions)

    def _compute(self, state) -> jax.Array:
        cm, mask = state["confusion_matrix"], self.class_mask
        tp = jnp.diagonal(cm)
        predicted, actual = jnp.sum(cm, axis=0), jnp.sum(cm, axis=1)
        if self.average_type == "micro":
            kept_tp = jnp.sum(tp * mask)
            precision = divide_no_nan(kept_tp, jnp.sum(predicted * mask))
            recall = divide_no_nan(kept_tp, jnp.sum(actual * mask))
            return fbeta(precision, recall, self.beta)
        per_class = fbeta(divide_no_nan(tp, predicted), divide_no_nan(tp, actual), self.beta)
        return jnp.sum(per_class * mask) / jnp.sum(mask)
