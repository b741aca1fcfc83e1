"""The metric library's cases: random batches and float64 NumPy references.

``CASES`` holds, for every metric setting, how to build the metric, how to draw a batch
and the reference written from the formula; ``draw`` draws batches and ``reference``
evaluates the reference on all of them at once. Shared by the metric tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from sklearn.metrics import roc_auc_score

import cerebrax as cstorch

NUM_BATCHES = 4
NUM_CLASSES = 6
# Labels and predictions are drawn from 0..4, so class 5 never occurs: it must be left
# out of the means that skip classes with a zero denominator.
DRAWN_CLASSES = 5


def _div(a, b):
    return a / b if b != 0 else 0.0


# ---- NumPy references (float64, from the formulas) -----------------------------------


def ref_accuracy(labels, predictions, weights=None):
    correct = (labels == predictions).astype(np.float64)
    if weights is None:
        return correct.mean()
    return (correct * weights).sum() / (weights > 0).sum()


def ref_mean(value, weight):
    weight = np.broadcast_to(weight, value.shape)
    return (value * weight).sum() / weight.sum()


def ref_perplexity(labels, loss, weights=None):
    tokens = labels.size if weights is None else (weights > 0).sum()
    return np.exp(loss.sum() / tokens)


def _class_counts(labels, predictions, weights, c):
    w = np.ones(labels.shape) if weights is None else weights
    tp = (w * ((labels == c) & (predictions == c))).sum()
    return tp, (w * (predictions == c)).sum(), (w * (labels == c)).sum()


def _f(p, r, beta):
    return _div((1 + beta**2) * p * r, beta**2 * p + r)


def ref_fbeta(labels, predictions, *, beta, average, ignore=()):
    kept = [c for c in range(NUM_CLASSES) if c not in ignore]
    counts = [_class_counts(labels, predictions, None, c) for c in kept]
    if average == "micro":
        tp, predicted, actual = (sum(x) for x in zip(*counts))
        return _f(_div(tp, predicted), _div(tp, actual), beta)
    return np.mean([_f(_div(tp, pr), _div(tp, ac), beta) for tp, pr, ac in counts])


def ref_mean_iou(labels, predictions, weights=None, *, ignore=()):
    scores = []
    for c in range(NUM_CLASSES):
        tp, predicted, actual = _class_counts(labels, predictions, weights, c)
        if c not in ignore and predicted + actual - tp != 0:
            scores.append(tp / (predicted + actual - tp))
    return np.mean(scores) if scores else 0.0


def ref_dice(labels, predictions, weights=None, *, ignore=()):
    scores = []
    for c in range(NUM_CLASSES):
        tp, predicted, actual = _class_counts(labels, predictions, weights, c)
        if c not in ignore and predicted + actual != 0:
            scores.append(2 * tp / (predicted + actual))
    return np.mean(scores) if scores else 0.0


def ref_mean_per_class_accuracy(labels, predictions, weights=None):
    w = np.ones(labels.shape) if weights is None else weights
    per_class = [
        _div((w * (labels == c) * (predictions == c)).sum(), (w * (labels == c)).sum())
        for c in range(NUM_CLASSES)
    ]
    return np.mean(per_class)


def ref_roc_auc(labels, predictions, weights=None):
    w = None if weights is None else weights.ravel()
    return roc_auc_score(labels.ravel(), predictions.ravel(), sample_weight=w)


def ref_at_k(labels, predictions, *, k, recall):
    """precision@k (or recall@k) with the top k of each row found by sorting."""
    labels = labels[..., None] if labels.ndim == predictions.ndim - 1 else labels
    top = np.argsort(-predictions, axis=-1, kind="stable")[..., :k].reshape(-1, k)
    rows = labels.reshape(-1, labels.shape[-1]).astype(np.int64)
    hits = sum(len(set(t.tolist()) & set(r.tolist())) for t, r in zip(top, rows))
    return hits / (len(rows) * (rows.shape[1] if recall else k))


# ---- random batches ---------------------------------------------------------------------


def classes(rng):
    shape = (8, 12)
    labels = rng.integers(0, DRAWN_CLASSES, shape).astype(np.int32)
    # Predictions agree with the labels half of the time, so scores are far from 0 and 1.
    noise = rng.integers(0, DRAWN_CLASSES, shape).astype(np.int32)
    predictions = np.where(rng.random(shape) < 0.5, labels, noise)
    return {"labels": labels, "predictions": predictions}


def weighted_classes(rng):
    batch = classes(rng)
    weights = rng.uniform(0.5, 2.0, batch["labels"].shape)
    weights[rng.random(weights.shape) < 0.3] = 0.0
    return {**batch, "weights": weights.astype(np.float32)}


def values(rng):
    return {"value": rng.normal(size=(8, 5)).astype(np.float32)}


def weighted_values(rng):
    return {**values(rng), "weight": rng.uniform(0.0, 3.0, (8, 5)).astype(np.float32)}


def row_weighted_values(rng):  # one weight per row, broadcast over the columns
    return {**values(rng), "weight": rng.uniform(0.0, 3.0, (8, 1)).astype(np.float32)}


def token_losses(rng):
    labels = rng.integers(0, 100, (4, 16)).astype(np.int32)
    return {"labels": labels, "loss": rng.uniform(0.0, 3.0, (4, 16)).astype(np.float32)}


# Predictions on a grid of 20 values with thresholds between them: the binned ROC curve
# is the empirical one, ties included, so the AUC equals sklearn's.
GRID_THRESHOLDS = np.arange(1, 20) / 20


def scored_labels(rng):
    labels = rng.integers(0, 2, (8, 12)).astype(np.int32)
    grid = np.clip(rng.integers(0, 20, labels.shape) + 6 * labels - 3, 0, 19)
    return {"labels": labels, "predictions": ((grid + 0.5) / 20).astype(np.float32)}


def weighted_scored_labels(rng):
    return {**scored_labels(rng), "weights": rng.uniform(0.2, 2.0, (8, 12)).astype(np.float32)}


def ranked_classes(rng):
    predictions = rng.normal(size=(8, NUM_CLASSES)).astype(np.float32)
    labels = np.stack([rng.permutation(NUM_CLASSES)[:2] for _ in range(8)]).astype(np.int32)
    return {"labels": labels, "predictions": predictions}


def masked_token_losses(rng):
    batch = token_losses(rng)
    weights = (rng.random(batch["labels"].shape) < 0.7).astype(np.float32)
    return {**batch, "loss": (batch["loss"] * weights).sum(), "weights": weights}


# ---- the table ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], cstorch.metrics.Metric]
    batch: Callable[[np.random.Generator], dict]
    reference: Callable[..., float]


CASES = [
    Case("accuracy", lambda: cstorch.metrics.AccuracyMetric("acc"), classes, ref_accuracy),
    Case(
        "accuracy_weighted",
        lambda: cstorch.metrics.AccuracyMetric("acc"),
        weighted_classes,
        ref_accuracy,
    ),
    Case(
        "mean",
        lambda: cstorch.metrics.MeanMetric("mean"),
        values,
        lambda value: ref_mean(value, 1.0),
    ),
    Case("mean_weighted", lambda: cstorch.metrics.MeanMetric("mean"), weighted_values, ref_mean),
    Case(
        "mean_row_weights",
        lambda: cstorch.metrics.MeanMetric("mean"),
        row_weighted_values,
        ref_mean,
    ),
    Case(
        "perplexity", lambda: cstorch.metrics.PerplexityMetric("ppl"), token_losses, ref_perplexity
    ),
    Case(
        "perplexity_weighted",
        lambda: cstorch.metrics.PerplexityMetric("ppl"),
        masked_token_losses,
        ref_perplexity,
    ),
    Case(
        "f1_micro",
        lambda: cstorch.metrics.FBetaScoreMetric(NUM_CLASSES),
        classes,
        lambda **b: ref_fbeta(**b, beta=1.0, average="micro"),
    ),
    Case(
        "f1_macro",
        lambda: cstorch.metrics.FBetaScoreMetric(NUM_CLASSES, average_type="macro"),
        classes,
        lambda **b: ref_fbeta(**b, beta=1.0, average="macro"),
    ),
    Case(
        "f2_micro_ignore",
        lambda: cstorch.metrics.FBetaScoreMetric(NUM_CLASSES, beta=2.0, ignore_labels=[0, 3]),
        classes,
        lambda **b: ref_fbeta(**b, beta=2.0, average="micro", ignore=(0, 3)),
    ),
    Case(
        "f05_macro_ignore",
        lambda: cstorch.metrics.FBetaScoreMetric(
            NUM_CLASSES, beta=0.5, average_type="macro", ignore_labels=2
        ),
        classes,
        lambda **b: ref_fbeta(**b, beta=0.5, average="macro", ignore=(2,)),
    ),
    Case("mean_iou", lambda: cstorch.metrics.MeanIOUMetric(NUM_CLASSES), classes, ref_mean_iou),
    Case(
        "mean_iou_weighted_ignore",
        lambda: cstorch.metrics.MeanIOUMetric(NUM_CLASSES, ignore_classes=[1]),
        weighted_classes,
        lambda **b: ref_mean_iou(**b, ignore=(1,)),
    ),
    Case("dice", lambda: cstorch.metrics.DiceCoefficientMetric(NUM_CLASSES), classes, ref_dice),
    Case(
        "dice_weighted_ignore",
        lambda: cstorch.metrics.DiceCoefficientMetric(NUM_CLASSES, ignore_classes=(0, 4)),
        weighted_classes,
        lambda **b: ref_dice(**b, ignore=(0, 4)),
    ),
    Case(
        "mean_per_class_accuracy",
        lambda: cstorch.metrics.MeanPerClassAccuracyMetric(NUM_CLASSES),
        classes,
        ref_mean_per_class_accuracy,
    ),
    Case(
        "mean_per_class_accuracy_weighted",
        lambda: cstorch.metrics.MeanPerClassAccuracyMetric(NUM_CLASSES),
        weighted_classes,
        ref_mean_per_class_accuracy,
    ),
    Case(
        "auc_roc",
        lambda: cstorch.metrics.AUCMetric(thresholds=GRID_THRESHOLDS),
        scored_labels,
        ref_roc_auc,
    ),
    Case(
        "auc_roc_weighted",
        lambda: cstorch.metrics.AUCMetric(thresholds=GRID_THRESHOLDS),
        weighted_scored_labels,
        ref_roc_auc,
    ),
    Case(
        "precision_at_2",
        lambda: cstorch.metrics.PrecisionAtKMetric(2),
        ranked_classes,
        lambda **b: ref_at_k(**b, k=2, recall=False),
    ),
    Case(
        "recall_at_3",
        lambda: cstorch.metrics.RecallAtKMetric(3),
        ranked_classes,
        lambda **b: ref_at_k(**b, k=3, recall=True),
    ),
]


def draw(case: Case, seed: int = 0, n: int = NUM_BATCHES) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [case.batch(rng) for _ in range(n)]


def reference(case: Case, batches: list[dict]) -> float:
    """The reference on all batches at once (batches are stacked along a new axis)."""
    stacked = {k: np.stack([np.asarray(b[k], np.float64) for b in batches]) for k in batches[0]}
    return float(case.reference(**stacked))
