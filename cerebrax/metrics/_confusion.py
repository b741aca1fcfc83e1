"""The confusion matrix, the base of metrics that accumulate one, and the base of those
whose value is a per-class ratio averaged over the classes.

Rows are labels, columns predictions: ``cm[i, j]`` is the (weighted) number of elements
with label ``i`` predicted as class ``j``. Elements whose label or prediction lies
outside ``[0, num_classes)`` are dropped.
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._base import Metric, divide_no_nan
from ._checks import batch_weights, check_num_classes, class_mask

__all__ = ["ClassMeanMetric", "ConfusionMatrixMetric", "confusion_matrix", "masked_class_mean"]


def confusion_matrix(
    labels: jax.Array, predictions: jax.Array, num_classes: int, weights: jax.Array
) -> jax.Array:
    """The float32 ``[num_classes, num_classes]`` confusion matrix of one batch.

    ``labels``, ``predictions`` and ``weights`` share one shape; each element adds its
    weight to ``cm[label, prediction]``.
    """
    labels = labels.astype(jnp.int32).ravel()
    predictions = predictions.astype(jnp.int32).ravel()
    in_range = (labels >= 0) & (labels < num_classes)
    in_range &= (predictions >= 0) & (predictions < num_classes)
    cell = jnp.where(in_range, labels * num_classes + predictions, 0)
    counts = jnp.zeros(num_classes * num_classes, jnp.float32)
    counts = counts.at[cell].add(jnp.where(in_range, weights.ravel(), 0))
    return counts.reshape(num_classes, num_classes)


def masked_class_mean(numerator: jax.Array, denominator: jax.Array, mask: np.ndarray):
    """Mean of ``numerator / denominator`` over the kept classes with a non-zero denominator.

    Classes with ``mask == 0`` or a zero denominator are left out; with none left the
    mean is 0.
    """
    denominator = denominator * mask
    valid = jnp.sum((denominator != 0).astype(jnp.float32))
    total = jnp.sum(divide_no_nan(numerator * mask, denominator))
    return divide_no_nan(total, valid)


class ConfusionMatrixMetric(Metric):
    """A metric whose state is the confusion matrix of every batch since the last reset.

    Args:
      num_classes: the number of classes; the matrix is ``[num_classes, num_classes]``.
      ignore: the classes left out of the value (None, one index, or several).
      ignore_arg: the name of the ``ignore`` argument, for error messages.
      name: the metric's name.
      min_classes: the smallest allowed ``num_classes``.
    """

    def __init__(
        self,
        num_classes: int,
        ignore: Any,
        *,
        ignore_arg: str,
        name: str | None,
        min_classes: int = 1,
    ):
        metric = type(self).__name__
        self.num_classes = check_num_classes(metric, num_classes, minimum=min_classes)
        self.class_mask = class_mask(metric, ignore_arg, self.num_classes, ignore)
        super().__init__(name)

    def _initial_state(self) -> dict[str, jax.Array]:
        shape = (self.num_classes, self.num_classes)
        return {"confusion_matrix": jnp.zeros(shape, jnp.float32)}

    def _update(
        self, state, labels: Any, predictions: Any, weights: Any = None
    ) -> dict[str, jax.Array]:
        labels, predictions = jnp.asarray(labels), jnp.asarray(predictions)
        weights = batch_weights(type(self).__name__, labels, predictions, weights)
        batch = confusion_matrix(labels, predictions, self.num_classes, weights)
        return {"confusion_matrix": state["confusion_matrix"] + batch}


class ClassMeanMetric(ConfusionMatrixMetric):
    """A confusion-matrix metric whose value is a per-class ratio averaged over the classes.

    A subclass gives each class's numerator and denominator (:meth:`_ratio`); the value
    is the mean of the ratios over the classes not in ``ignore_classes`` (None, one
    index, or several) whose denominator is non-zero (0 if there is none).
    """

    def __init__(self, num_classes: int, ignore_classes: Any = None, name: str | None = None):
        super().__init__(num_classes, ignore_classes, ignore_arg="ignore_classes", name=name)

    @abc.abstractmethod
    def _ratio(self, cm: jax.Array, tp: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The per-class numerators and denominators, from ``cm`` and ``tp = diag(cm)``."""

    def _compute(self, state) -> jax.Array:
        cm = state["confusion_matrix"]
        numerator, denominator = self._ratio(cm, jnp.diagonal(cm))
        return masked_class_mean(numerator, denominator, self.class_mask)
