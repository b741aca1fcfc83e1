"""``PrecisionAtKMetric`` and ``RecallAtKMetric``: how well the top-k classes hit the labels.

For every example the ``k`` classes with the highest scores are its predictions (ties
go to the lower class index, as ``jax.lax.top_k`` breaks them), and its labels are a
set of class ids. A hit is a predicted class that is one of the labels:

- precision@k = sum(w * hits) / sum(w * k): the share of predictions that are labels;
- recall@k = sum(w * hits) / sum(w * num_labels): the share of labels predicted.

Label ids outside ``[0, num_classes)`` (padding, e.g. -1) are never hit, so they count
as missed labels in recall@k, as in ``tf.compat.v1.metrics.recall_at_k``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._filters import check_int
from ..errors import ConfigError
from ._base import Metric, as_float, divide_no_nan
from ._checks import broadcast_weights

__all__ = ["PrecisionAtKMetric", "RecallAtKMetric"]


def top_k_hits(labels: jax.Array, predictions: jax.Array, k: int) -> jax.Array:
    """Per example, how many of the ``k`` top-scored classes are among its labels.

    ``labels`` is ``[..., num_labels]`` and ``predictions`` ``[..., num_classes]``.
    """
    top = jax.lax.top_k(predictions, k)[1]  # [..., k]
    found = labels[..., :, None] == top[..., None, :]  # [..., num_labels, k]
    return jnp.sum(jnp.any(found, axis=-2), axis=-1).astype(jnp.float32)


class _TopKMetric(Metric):
    """Sums ``w * hits`` and ``w * denominator`` per example; the value is their ratio."""

    def __init__(self, k: int, name: str | None = None):
        self.k = check_int(f"{type(self).__name__}(k=...)", k, ge=1)
        super().__init__(name)

    def _initial_state(self) -> dict[str, jax.Array]:
        return {"hits": jnp.float32(0), "total": jnp.float32(0)}

    def _per_example_total(self, num_labels: int) -> int:
        raise NotImplementedError

    def _update(
        self, state, labels: Any, predictions: Any, weights: Any = None
    ) -> dict[str, jax.Array]:
        metric = type(self).__name__
        labels, predictions = jnp.asarray(labels), as_float(predictions)
        if predictions.ndim < 1 or labels.ndim not in (predictions.ndim - 1, predictions.ndim):
            raise ConfigError(
                f"{metric}.update(): `predictions` must be scores [..., num_classes] and "
                f"`labels` class ids [...] or [..., num_labels] with the same leading "
                f"dimensions, got shapes {predictions.shape} and {labels.shape}."
            )
        if labels.ndim == predictions.ndim - 1:
            labels = labels[..., None]  # one label per example
        batch = predictions.shape[:-1]
        if labels.shape[:-1] != batch:
            raise ConfigError(
                f"{metric}.update(): `labels` {labels.shape} and `predictions` "
                f"{predictions.shape} differ in their leading (example) dimensions."
            )
        if self.k > predictions.shape[-1]:
            raise ConfigError(
                f"{metric}(k={self.k}) needs at least k classes, but `predictions` scores "
                f"{predictions.shape[-1]}. Lower k."
            )
        weights = broadcast_weights(metric, 1.0 if weights is None else weights, batch)
        hits = top_k_hits(labels, predictions, self.k)
        return {
            "hits": state["hits"] + jnp.sum(weights * hits),
            "total": state["total"] + jnp.sum(weights) * self._per_example_total(
                labels.shape[-1]),
        }

    def _compute(self, state) -> jax.Array:
        return divide_no_nan(state["hits"], state["total"])


class PrecisionAtKMetric(_TopKMetric):
    """Precision@k: the share of each example's ``k`` top-scored classes that are labels.

    ``update(labels, predictions, weights=None)``: ``predictions`` are class scores
    ``[..., num_classes]``, ``labels`` the distinct class ids of each example
    (``[...]`` for one, ``[..., num_labels]`` for several), ``weights`` one per example.
    The value is ``sum(w * hits) / sum(w * k)`` over every batch since the last reset.

    Args:
      k: how many top-scored classes each example predicts.
      name: the metric's name (default ``"PrecisionAtKMetric"``).

    Example:
      >>> p = cstorch.metrics.PrecisionAtKMetric(k=2)
      >>> p.update(labels=jnp.array([[0, 3], [1, 2]]),
      ...          predictions=jnp.array([[0.9, 0.1, 0.3, 0.2], [0.1, 0.5, 0.4, 0.6]]))
      >>> float(p)  # hits: {0} of {0, 2}; {1} of {3, 1}
      0.5
    """

    def _per_example_total(self, num_labels: int) -> int:
        return self.k


class RecallAtKMetric(_TopKMetric):
    """Recall@k: the share of each example's labels among its ``k`` top-scored classes.

    ``update(labels, predictions, weights=None)`` takes what
    :class:`PrecisionAtKMetric` takes; the value is ``sum(w * hits) /
    sum(w * num_labels)`` over every batch since the last reset (a label id outside
    ``[0, num_classes)`` is a missed label).

    Args:
      k: how many top-scored classes each example predicts.
      name: the metric's name (default ``"RecallAtKMetric"``).

    Example:
      >>> r = cstorch.metrics.RecallAtKMetric(k=1)
      >>> r.update(labels=jnp.array([2, 0]), predictions=jnp.array([[0, 1, 3], [5, 1, 0]]))
      >>> float(r)
      1.0
    """

    def _per_example_total(self, num_labels: int) -> int:
        return num_labels
