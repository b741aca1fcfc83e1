"""``DiceCoefficientMetric``: the Dice (F1) overlap per class, averaged over classes."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._confusion import ClassMeanMetric

__all__ = ["DiceCoefficientMetric"]


class DiceCoefficientMetric(ClassMeanMetric):
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

    def _ratio(self, cm: jax.Array, tp: jax.Array) -> tuple[jax.Array, jax.Array]:
        return 2 * tp, jnp.sum(cm, axis=0) + jnp.sum(cm, axis=1)
