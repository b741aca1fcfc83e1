"""``DiceCoefficientMetric``: the Dice (F1) overlap per class, averaged over classes."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._confusion import ConfusionMatrixMetric, masked_class_mean

__all__ = ["DiceCoefficientMetric"]


class DiceCoefficientMetric(ConfusionMatrixMetric):
    """Mean Dice coefficient, a score of semantic segmentation.

    ``update(labels, predictions, weights=None)`` adds each element's weight (default 1;
    weights broadcast to the labels' shape, 0 masks an element) to the confusion matrix
    ``cm`` (rows labels, columns predictions). With ``tp = diag(cm)``::

        dice[c] = 2 * tp[c] / (sum(cm[c, :]) + sum(cm[:, c]))

    and the value is the mean of ``dice`` over the classes not in ``ignore_classes``
    whose denominator is non-zero (0 if there is none).

    Args:
      num_classes: the number of classes (at least 1).
      ignore_classes: classes left out of the mean: None, one index, or several.
      name: the metric's name (default ``"DiceCoefficientMetric"``).

    Example:
      >>> dice = cstorch.metrics.DiceCoefficientMetric(num_classes=3)
      >>> dice.update(labels=jnp.array([0, 1, 1, 2]), predictions=jnp.array([0, 1, 2, 2]))
      >>> round(float(dice), 4)  # (1 + 2/3 + 2/3) / 3
      0.7778
    """

    def __init__(self, num_classes: int, ignore_classes: Any = None, name: str | None = None):
        super().__init__(num_classes, ignore_classes, ignore_arg="ignore_classes", name=name)

    def _compute(self, state) -> jax.Array:
        cm = state["confusion_matrix"]
        tp = jnp.diagonal(cm)
        total = jnp.sum(cm, axis=0) + jnp.sum(cm, axis=1)
        return masked_class_mean(2 * tp, total, self.class_mask)
