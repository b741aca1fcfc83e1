"""Every metric of the library against a plain NumPy reference, eagerly and traced.

Each case draws several random batches, feeds them to the metric (eagerly, then inside
one ``@cstorch.trace`` evaluation step that compiles once) and compares the value with
a NumPy reference computed from all batches at once, written from the formula.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import compiled_mlp

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


_CASES = [
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
]


def draw(case: Case, seed: int = 0, n: int = NUM_BATCHES) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [case.batch(rng) for _ in range(n)]


def reference(case: Case, batches: list[dict]) -> float:
    """The reference on all batches at once (batches are stacked along a new axis)."""
    stacked = {k: np.stack([np.asarray(b[k], np.float64) for b in batches]) for k in batches[0]}
    return float(case.reference(**stacked))


@pytest.fixture(params=_CASES, ids=[c.id for c in _CASES])
def case(request) -> Case:
    return request.param


def test_eager_updates_match_numpy(case):
    metric = case.make()
    data = draw(case)
    for batch in data:
        metric.update(**batch)
    assert metric.num_updates == NUM_BATCHES
    assert float(metric) == pytest.approx(reference(case, data), rel=1e-5, abs=1e-6)


def test_traced_updates_match_numpy_with_one_compile(case):
    metric = case.make()

    @cstorch.trace
    def eval_step(batch):
        metric(**batch)

    data = draw(case, seed=1)
    for batch in data:
        eval_step(batch)
    assert eval_step.num_compiles == 1
    assert metric.num_updates == NUM_BATCHES  # counted on every call, not only the trace
    assert float(metric) == pytest.approx(reference(case, data), rel=1e-5, abs=1e-6)


def test_reset_starts_over(case):
    metric = case.make()
    first, second = draw(case, seed=2, n=2)
    metric.update(**first)
    metric.reset()
    assert metric.num_updates == 0
    with pytest.raises(cstorch.StateError, match="has not been updated"):
        float(metric)
    metric.update(**second)
    assert float(metric) == pytest.approx(reference(case, [second]), rel=1e-5, abs=1e-6)


def test_call_returns_the_running_value(case):
    metric = case.make()
    data = draw(case, seed=3, n=2)
    metric(**data[0])
    value = metric(**data[1])
    assert float(value) == pytest.approx(reference(case, data), rel=1e-5, abs=1e-6)


# ---- the update count and compute before any update -------------------------------------


def test_compute_before_any_update_raises():
    metric = cstorch.metrics.MeanMetric("loss")
    with pytest.raises(cstorch.StateError, match="Trying to compute metric `loss`"):
        metric.compute()
    with pytest.raises(cstorch.StateError, match="has not been updated"):
        float(metric)


def test_reset_inside_a_traced_step_zeroes_the_count():
    metric = cstorch.metrics.MeanMetric("m")

    @cstorch.trace
    def step(x):
        metric.reset()
        metric(x)

    for v in (1.0, 5.0, 3.0):
        step(jnp.full((4,), v))
    assert metric.num_updates == 1
    assert float(metric) == pytest.approx(3.0)
    assert step.num_compiles == 1


def test_traced_count_and_eager_updates_add_up():
    metric = cstorch.metrics.MeanMetric("m")
    metric.update(jnp.float32(2.0))

    @cstorch.trace
    def step(x):
        metric(x)
        return metric.num_updates  # the traced count

    counts = [int(step(jnp.float32(4.0))) for _ in range(3)]
    assert counts == [2, 3, 4]
    assert float(metric) == pytest.approx((2.0 + 3 * 4.0) / 4)


def test_compute_inside_a_step_needs_no_update_in_that_step():
    metric = cstorch.metrics.MeanMetric("m")
    metric.update(jnp.float32(7.0))

    @cstorch.trace
    def read():
        return metric.compute()

    assert float(read()) == pytest.approx(7.0)


def test_mean_of_the_loss_after_backward_is_deferred_and_counted():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    mean_loss = cstorch.metrics.MeanMetric("loss")

    @cstorch.trace
    def step(x):
        loss = jnp.mean(model(x) ** 2)
        cstorch.backward(loss)
        optimizer.step()
        assert mean_loss(loss) is None  # deferred until the gradients exist
        return loss

    rng = np.random.default_rng(0)
    losses = [float(step(rng.normal(size=(4, 8)).astype(np.float32))) for _ in range(3)]
    assert mean_loss.num_updates == 3
    assert float(mean_loss) == pytest.approx(np.mean(losses), rel=1e-6)


def test_dtype_casts_the_value():
    metric = cstorch.metrics.MeanMetric("m")
    metric.update(jnp.array([1.0, 2.0]), dtype=jnp.bfloat16)
    assert metric.compute().dtype == jnp.bfloat16
    metric.reset()
    metric.update(jnp.array([1.0, 2.0]))
    assert metric.compute().dtype == jnp.float32


def test_out_of_range_labels_are_dropped():
    metric = cstorch.metrics.MeanIOUMetric(3)
    metric.update(labels=np.array([0, 1, -1, 7]), predictions=np.array([0, 1, 1, 2]))
    assert float(metric) == pytest.approx(1.0)  # only the two in-range, correct pairs


def test_no_class_with_a_denominator_gives_zero():
    metric = cstorch.metrics.DiceCoefficientMetric(3, ignore_classes=[1, 2])
    metric.update(labels=np.array([1, 2]), predictions=np.array([2, 1]))
    assert float(metric) == 0.0


# ---- argument validation ------------------------------------------------------------------

M = cstorch.metrics

_INVALID = [
    (lambda: M.FBetaScoreMetric(1), "num_classes"),
    (lambda: M.FBetaScoreMetric(2.5), "num_classes"),
    (lambda: M.FBetaScoreMetric(True), "num_classes"),
    (lambda: M.FBetaScoreMetric(3, beta=0), "beta"),
    (lambda: M.FBetaScoreMetric(3, beta=-1.0), "beta"),
    (lambda: M.FBetaScoreMetric(3, beta=float("inf")), "beta"),
    (lambda: M.FBetaScoreMetric(3, beta="one"), "beta"),
    (lambda: M.FBetaScoreMetric(3, average_type="weighted"), "average_type"),
    (lambda: M.FBetaScoreMetric(3, ignore_labels=[3]), "ignore_labels"),
    (lambda: M.FBetaScoreMetric(3, ignore_labels=[0, 1, 2]), "ignore_labels"),
    (lambda: M.FBetaScoreMetric(3, ignore_labels=["a"]), "ignore_labels"),
    (lambda: M.MeanIOUMetric(0), "num_classes"),
    (lambda: M.MeanIOUMetric(3, ignore_classes=-1), "ignore_classes"),
    (lambda: M.DiceCoefficientMetric("3"), "num_classes"),
    (lambda: M.DiceCoefficientMetric(2, ignore_classes=[0, 1]), "ignore_classes"),
    (lambda: M.MeanPerClassAccuracyMetric(0), "num_classes"),
    (lambda: M.MeanMetric(name=3), "name"),
]


@pytest.mark.parametrize("make, argument", _INVALID)
def test_invalid_arguments_raise_config_error(make, argument):
    with pytest.raises(cstorch.ConfigError, match=argument):
        make()


_BAD_UPDATES = [
    (
        lambda: M.FBetaScoreMetric(3),
        {"labels": np.zeros(4), "predictions": np.zeros(5)},
        "predictions",
    ),
    (
        lambda: M.MeanIOUMetric(3),
        {"labels": np.zeros(4), "predictions": np.zeros((4, 1))},
        "predictions",
    ),
    (
        lambda: M.DiceCoefficientMetric(3),
        {"labels": np.zeros(4), "predictions": np.zeros(4), "weights": np.ones(3)},
        "weights",
    ),
    (
        lambda: M.MeanPerClassAccuracyMetric(3),
        {"labels": np.zeros(4), "predictions": np.zeros(4), "weights": np.ones(2)},
        "weights",
    ),
    (lambda: M.MeanMetric(), {"value": np.zeros(4), "weight": np.ones(3)}, "`weight`"),
    (
        lambda: M.PerplexityMetric(),
        {"labels": np.zeros(4), "loss": 1.0, "weights": np.ones(3)},
        "weights",
    ),
]


@pytest.mark.parametrize("make, batch, argument", _BAD_UPDATES)
def test_mismatched_update_shapes_raise_config_error(make, batch, argument):
    metric = make()
    with pytest.raises(cstorch.ConfigError, match=argument):
        metric.update(**batch)
    assert metric.num_updates == 0
