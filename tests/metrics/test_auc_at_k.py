"""AUCMetric against scikit-learn, PrecisionAtKMetric / RecallAtKMetric against numpy.

AUC references. With thresholds between the sorted distinct predictions every
threshold interval holds one prediction, so the binned curve is the empirical one:
the ROC trapezoid sum equals ``roc_auc_score`` and the PR "majoring" sum equals
``average_precision_score`` (adding a positive never lowers precision, so sklearn's
step height is the upper one), both to float32 rounding. With evenly spaced thresholds
the ROC trapezoid sum is the Mann-Whitney statistic of the binned predictions, off from
the exact AUC by at most 1/2 per positive-negative pair sharing a bin: that bound,
computed from the data, is the tolerance. The PR "interpolation" sum (Davis-Goadrich)
is a different estimator from sklearn's step-wise average precision: it lies between
the minoring and majoring sums (precision is monotone along each interpolated segment),
and its gap to average precision is about (1/P) * sum over positives of
fp_n / (2 n^2) <= log(n) / (2 P), measured at 6e-4 here, so it is compared to 1e-3.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

import cerebrax as cstorch

F32 = 2e-6  # float32 sums of a few hundred terms


def scores(seed: int = 0, n: int = 600, weighted: bool = False):
    """Labels, distinct predictions in (0, 1) that lean towards the labels, weights."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    predictions = 1 / (1 + np.exp(-(rng.normal(size=n) + labels)))
    assert len(np.unique(predictions)) == n
    weights = rng.uniform(0.2, 2.0, n) if weighted else None
    return labels, predictions.astype(np.float32), weights


def midpoints(predictions: np.ndarray) -> np.ndarray:
    values = np.unique(predictions.astype(np.float64))
    return (values[:-1] + values[1:]) / 2


def auc_of(batches, **kwargs) -> float:
    metric = cstorch.metrics.AUCMetric(**kwargs)
    for labels, predictions, weights in batches:
        metric.update(labels, predictions, weights)
    return float(metric)


def split(labels, predictions, weights, parts: int = 3):
    """The data as ``parts`` batches (the metric accumulates across them)."""
    w = [None] * parts if weights is None else np.array_split(weights, parts)
    return list(zip(np.array_split(labels, parts), np.array_split(predictions, parts), w))


@pytest.mark.parametrize("weighted", [False, True])
def test_roc_with_thresholds_between_predictions_is_sklearn(weighted):
    labels, predictions, weights = scores(1, weighted=weighted)
    value = auc_of(split(labels, predictions, weights), thresholds=midpoints(predictions))
    assert value == pytest.approx(roc_auc_score(labels, predictions, sample_weight=weights),
                                  abs=F32)


@pytest.mark.parametrize("weighted", [False, True])
def test_pr_majoring_with_thresholds_between_predictions_is_average_precision(weighted):
    labels, predictions, weights = scores(2, weighted=weighted)
    value = auc_of(split(labels, predictions, weights), curve="PR",
                   summation_method="majoring", thresholds=midpoints(predictions))
    expected = average_precision_score(labels, predictions, sample_weight=weights)
    assert value == pytest.approx(expected, abs=F32)


@pytest.mark.parametrize("num_thresholds", [200, 2000])
def test_roc_with_even_thresholds_is_within_the_binning_bound(num_thresholds):
    labels, predictions, _ = scores(3)
    value = auc_of([(labels, predictions, None)], num_thresholds=num_thresholds)
    # Bin of each prediction: the number of thresholds strictly below it.
    edges = cstorch.metrics.AUCMetric(num_thresholds).thresholds.astype(np.float64)
    bins = np.searchsorted(edges, predictions.astype(np.float64), side="left")
    pos = np.bincount(bins[labels == 1], minlength=num_thresholds + 1)
    neg = np.bincount(bins[labels == 0], minlength=num_thresholds + 1)
    bound = 0.5 * np.sum(pos * neg) / (pos.sum() * neg.sum())
    exact = roc_auc_score(labels, predictions)
    assert abs(value - exact) <= bound + F32
    if num_thresholds == 2000:
        assert abs(value - exact) < 1e-3


def test_pr_interpolation_lies_between_minoring_and_majoring_and_near_ap():
    labels, predictions, _ = scores(4)
    data = [(labels, predictions, None)]
    common = dict(curve="PR", num_thresholds=2000)
    low = auc_of(data, summation_method="minoring", **common)
    mid = auc_of(data, summation_method="interpolation", **common)
    high = auc_of(data, summation_method="majoring", **common)
    assert low - F32 <= mid <= high + F32
    assert mid == pytest.approx(average_precision_score(labels, predictions), abs=1e-3)


def test_roc_minoring_and_majoring_bound_the_exact_auc():
    labels, predictions, _ = scores(5)
    data = [(labels, predictions, None)]
    exact = roc_auc_score(labels, predictions)
    assert auc_of(data, summation_method="minoring") <= exact + F32
    assert auc_of(data, summation_method="majoring") >= exact - F32


def test_auc_inside_a_traced_step_compiles_once_and_matches_sklearn():
    labels, predictions, _ = scores(6)
    metric = cstorch.metrics.AUCMetric(thresholds=midpoints(predictions))

    @cstorch.trace
    def eval_step(y, p):
        metric(labels=y, predictions=p)

    for y, p, _ in split(labels, predictions, None, parts=4):
        eval_step(y[:150], p[:150])
    assert eval_step.num_compiles == 1
    assert float(metric) == pytest.approx(roc_auc_score(labels, predictions), abs=F32)


@pytest.mark.parametrize("kwargs, match", [
    (dict(curve="AUC"), "`curve` must be one of"),
    (dict(summation_method="trapezoidal"), "`summation_method` must be one of"),
    (dict(num_thresholds=1), "`num_thresholds` must be an integer > 1"),
    (dict(thresholds=[0.5, 1.5]), r"values in \[0, 1\]"),
])
def test_auc_argument_errors(kwargs, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        cstorch.metrics.AUCMetric(**kwargs)


# ---- precision@k and recall@k -------------------------------------------------------------


def ref_at_k(labels, predictions, k, weights=None):
    """(precision@k, recall@k) by sorting each row's scores in numpy."""
    top = np.argsort(-predictions, axis=-1, kind="stable")[..., :k]
    labels = labels[..., None] if labels.ndim == predictions.ndim - 1 else labels
    hits = np.array([len(set(t.tolist()) & set(lab.tolist()))
                     for t, lab in zip(top.reshape(-1, k), labels.reshape(-1, labels.shape[-1]))])
    w = np.ones(len(hits)) if weights is None else np.broadcast_to(weights, top.shape[:-1]).ravel()
    return (w * hits).sum() / (w.sum() * k), (w * hits).sum() / (w.sum() * labels.shape[-1])


def ranking_batch(rng, shape=(16,), classes=10, num_labels=None):
    predictions = rng.normal(size=(*shape, classes)).astype(np.float32)
    if num_labels is None:
        return rng.integers(0, classes, shape), predictions
    labels = np.stack([rng.permutation(classes)[:num_labels]
                       for _ in range(int(np.prod(shape)))]).reshape(*shape, num_labels)
    return labels, predictions


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("num_labels, weighted", [(None, False), (4, False), (4, True)])
def test_precision_and_recall_at_k_match_numpy(k, num_labels, weighted):
    rng = np.random.default_rng(k)
    batches = [ranking_batch(rng, num_labels=num_labels) for _ in range(3)]
    weights = [rng.uniform(0, 2, 16) if weighted else None for _ in batches]
    precision = cstorch.metrics.PrecisionAtKMetric(k)
    recall = cstorch.metrics.RecallAtKMetric(k, name="recall")
    for (labels, predictions), w in zip(batches, weights):
        precision.update(labels, predictions, weights=w)
        recall.update(labels, predictions, weights=w)
    all_labels = np.concatenate([b[0] for b in batches])
    all_predictions = np.concatenate([b[1] for b in batches])
    all_weights = None if not weighted else np.concatenate(weights)
    ref_p, ref_r = ref_at_k(all_labels, all_predictions, k, all_weights)
    assert float(precision) == pytest.approx(ref_p, rel=1e-6)
    assert float(recall) == pytest.approx(ref_r, rel=1e-6)


def test_at_k_over_extra_leading_dimensions_and_in_a_traced_step():
    rng = np.random.default_rng(7)
    labels, predictions = ranking_batch(rng, shape=(4, 6), num_labels=2)
    precision = cstorch.metrics.PrecisionAtKMetric(k=2)

    @cstorch.trace
    def eval_step(y, p):
        precision(labels=y, predictions=p)

    eval_step(labels, predictions)
    eval_step(labels[::-1], predictions[::-1])
    assert eval_step.num_compiles == 1
    ref_p, _ = ref_at_k(np.concatenate([labels, labels]), np.concatenate([predictions] * 2), 2)
    assert float(precision) == pytest.approx(ref_p, rel=1e-6)


def test_recall_counts_out_of_range_labels_as_missed():
    labels = np.array([[0, -1], [2, 9]])  # -1 and 9 are not classes of 3 scores
    predictions = np.array([[0.9, 0.1, 0.0], [0.0, 0.1, 0.9]], np.float32)
    recall = cstorch.metrics.RecallAtKMetric(k=1)
    recall.update(labels, predictions)
    assert float(recall) == pytest.approx(2 / 4)


@pytest.mark.parametrize("metric", ["PrecisionAtKMetric", "RecallAtKMetric"])
def test_at_k_errors(metric):
    cls = getattr(cstorch.metrics, metric)
    with pytest.raises(cstorch.ConfigError, match="must be an integer >= 1"):
        cls(k=0)
    with pytest.raises(cstorch.ConfigError, match="needs at least k classes"):
        cls(k=5).update(np.array([0]), np.zeros((1, 3), np.float32))
    with pytest.raises(cstorch.ConfigError, match="leading"):
        cls(k=1).update(np.zeros((2, 1), np.int32), np.zeros((3, 4), np.float32))


def test_new_metrics_are_registered_by_name():
    auc = cstorch.metrics.AUCMetric(name="auc")
    p = cstorch.metrics.PrecisionAtKMetric(3, name="p@3")
    registry = cstorch.metrics.get_all_metrics()
    assert registry["auc"] is auc and registry["p@3"] is p
