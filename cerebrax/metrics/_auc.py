"""``AUCMetric``: the area under the ROC or precision-recall curve, from binned counts.

The metric keeps, for a fixed ascending list of thresholds ``t_0 < ... < t_{T-1}``, the
(weighted) true and false positives and negatives of the classifier
``prediction > t_j``, summed over every batch. The curve through those ``T`` points is
integrated by a Riemann sum, as ``tf.keras.metrics.AUC`` does; the default thresholds
are ``-eps, 1/(T-1), ..., (T-2)/(T-1), 1 + eps`` (``eps = 1e-7``), so the first point
counts every sample as positive and the last none.

Accuracy. With the ROC curve and ``"interpolation"`` the sum is the trapezoid rule,
which equals the Mann-Whitney statistic of the binned predictions: it differs from
the exact AUC only through positive-negative pairs whose predictions share a bin,
each off by at most 1/2. Thresholds between the sorted distinct predictions make it
exact. ``"minoring"`` and ``"majoring"`` give a lower and an upper Riemann sum.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from ._base import Metric, as_float, divide_no_nan
from ._checks import batch_weights

__all__ = ["AUCMetric"]

_EPSILON = 1e-7
_CURVES = ("ROC", "PR")
_SUMMATIONS = ("interpolation", "minoring", "majoring")


def default_thresholds(num_thresholds: int) -> np.ndarray:
    """``num_thresholds`` evenly spaced thresholds, the ends just outside [0, 1]."""
    inner = np.arange(1, num_thresholds - 1, dtype=np.float64) / (num_thresholds - 1)
    return np.concatenate([[-_EPSILON], inner, [1 + _EPSILON]]).astype(np.float32)


def _given_thresholds(thresholds: Any) -> np.ndarray:
    values = np.asarray(thresholds, dtype=np.float64).ravel()
    if values.size == 0 or not np.all((values >= 0) & (values <= 1)):
        raise ConfigError(
            f"AUCMetric(thresholds=...) must be a non-empty list of values in [0, 1], got "
            f"{thresholds!r}."
        )
    values = np.unique(values)  # sorted, without repeats
    return np.concatenate([[-_EPSILON], values, [1 + _EPSILON]]).astype(np.float32)


def binned_counts(
    labels: jax.Array, predictions: jax.Array, weights: jax.Array, thresholds: np.ndarray
) -> dict[str, jax.Array]:
    """The weighted ``tp, fp, tn, fn`` of ``prediction > t`` at every threshold ``t``.

    Each prediction falls in bucket ``b`` = the number of thresholds below it (it is a
    positive at thresholds ``0..b-1``); the counts at threshold ``j`` are sums over the
    buckets above and below ``j``, so the work is O(n log T + T), not O(n T).
    """
    num = len(thresholds)
    bucket = jnp.searchsorted(jnp.asarray(thresholds), predictions.ravel(), side="left")
    positive = labels.ravel() != 0
    weights = weights.ravel()
    pos = jnp.zeros(num + 1, jnp.float32).at[bucket].add(jnp.where(positive, weights, 0))
    neg = jnp.zeros(num + 1, jnp.float32).at[bucket].add(jnp.where(positive, 0, weights))
    pos_at_or_below, neg_at_or_below = jnp.cumsum(pos)[:num], jnp.cumsum(neg)[:num]
    return {
        "true_positives": jnp.sum(pos) - pos_at_or_below,
        "false_positives": jnp.sum(neg) - neg_at_or_below,
        "true_negatives": neg_at_or_below,
        "false_negatives": pos_at_or_below,
    }


def _interpolated_pr_auc(tp: jax.Array, fp: jax.Array, fn: jax.Array) -> jax.Array:
    """PR-AUC with precision interpolated between the points (Davis and Goadrich, 2006).

    Between two thresholds the true positives grow linearly with the predicted
    positives ``p``: ``tp = slope * p + intercept``, so precision is ``slope +
    intercept / p``, whose integral over recall has the closed form summed here.
    """
    dtp = tp[:-1] - tp[1:]
    p = tp + fp
    dp = p[:-1] - p[1:]
    slope = divide_no_nan(dtp, jnp.maximum(dp, 0))
    intercept = tp[1:] - slope * p[1:]
    both = (p[:-1] > 0) & (p[1:] > 0)
    ratio = jnp.where(both, divide_no_nan(p[:-1], jnp.maximum(p[1:], 0)), 1.0)
    area = slope * (dtp + intercept * jnp.log(ratio))
    return jnp.sum(divide_no_nan(area, jnp.maximum(tp[1:] + fn[1:], 0)))


class AUCMetric(Metric):
    """Approximate area under the ROC or the precision-recall curve.

    ``update(labels, predictions, weights=None)``: ``labels`` are 0 / 1 (non-zero is
    positive), ``predictions`` probabilities in [0, 1] of the same shape, ``weights``
    broadcast to that shape. Every element adds its weight to the counts of the
    thresholds it exceeds (see the module's notes); ``compute`` integrates the curve.

    Args:
      num_thresholds: how many thresholds (more than 1) when ``thresholds`` is None.
      curve: ``"ROC"`` (recall over false-positive rate) or ``"PR"`` (precision over
        recall).
      name: the metric's name (default ``"AUCMetric"``).
      summation_method: ``"interpolation"`` (trapezoids for ROC; for PR, precision
        interpolated as in Davis and Goadrich), ``"minoring"`` (the lower height of
        each interval) or ``"majoring"`` (the upper height).
      thresholds: thresholds in [0, 1] to use instead of evenly spaced ones; ``-eps``
        and ``1 + eps`` are added, and ``num_thresholds`` is ignored.

    Example:
      >>> auc = cstorch.metrics.AUCMetric(num_thresholds=3)   # thresholds -eps, 0.5, 1+eps
      >>> auc.update(labels=jnp.array([0, 0, 1, 1]), predictions=jnp.array([0, 0.5, 0.7, 1]))
      >>> round(float(auc), 4)  # ROC points (1, 1), (0, 1), (0, 0)
      1.0
    """

    def __init__(
        self,
        num_thresholds: int = 200,
        curve: str = "ROC",
        name: str | None = None,
        summation_method: str = "interpolation",
        thresholds: Any = None,
    ):
        metric = type(self).__name__
        if curve not in _CURVES:
            raise ConfigError(f"{metric}: `curve` must be one of {_CURVES}, got {curve=}.")
        if summation_method not in _SUMMATIONS:
            raise ConfigError(
                f"{metric}: `summation_method` must be one of {_SUMMATIONS}, got "
                f"{summation_method=}."
            )
        if thresholds is not None:
            self.thresholds = _given_thresholds(thresholds)
        else:
            if isinstance(num_thresholds, bool) or not isinstance(num_thresholds, int) or (
                    num_thresholds <= 1):
                raise ConfigError(
                    f"{metric}: `num_thresholds` must be an integer > 1, got "
                    f"{num_thresholds=}."
                )
            self.thresholds = default_thresholds(num_thresholds)
        self.num_thresholds = len(self.thresholds)
        self.curve, self.summation_method = curve, summation_method
        super().__init__(name)

    def _initial_state(self) -> dict[str, jax.Array]:
        zeros = jnp.zeros(self.num_thresholds, jnp.float32)
        return {key: zeros for key in
                ("true_positives", "false_positives", "true_negatives", "false_negatives")}

    def _update(
        self, state, labels: Any, predictions: Any, weights: Any = None
    ) -> dict[str, jax.Array]:
        labels, predictions = jnp.asarray(labels), as_float(predictions)
        weights = batch_weights(type(self).__name__, labels, predictions, weights)
        batch = binned_counts(labels, predictions, weights, self.thresholds)
        return {key: state[key] + batch[key] for key in state}

    def _compute(self, state) -> jax.Array:
        tp, fp = state["true_positives"], state["false_positives"]
        tn, fn = state["true_negatives"], state["false_negatives"]
        if self.curve == "PR" and self.summation_method == "interpolation":
            return _interpolated_pr_auc(tp, fp, fn)
        recall = divide_no_nan(tp, tp + fn)
        if self.curve == "ROC":
            x, y = divide_no_nan(fp, fp + tn), recall
        else:
            x, y = recall, divide_no_nan(tp, tp + fp)
        if self.summation_method == "interpolation":
            heights = (y[:-1] + y[1:]) / 2
        elif self.summation_method == "minoring":
            heights = jnp.minimum(y[:-1], y[1:])
        else:
            heights = jnp.maximum(y[:-1], y[1:])
        return jnp.sum((x[:-1] - x[1:]) * heights)
