"""AccuracyMetric against numpy, eagerly and inside traced steps."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import batches, compiled_mlp, mlp_apply, mlp_params

import cerebrax as cstorch


def test_accuracy_accumulates_like_numpy():
    rng = np.random.default_rng(0)
    metric = cstorch.metrics.AccuracyMetric("acc")
    labels = rng.integers(0, 3, size=(5, 16))
    preds = rng.integers(0, 3, size=(5, 16))
    for lab, pred in zip(labels, preds):
        metric.update(lab, pred)
    assert float(metric) == pytest.approx((labels == preds).mean(), rel=1e-6)
    metric.reset()
    metric.update(labels[0], labels[0])
    assert float(metric) == 1.0


def test_weighted_accuracy_counts_positive_weights():
    metric = cstorch.metrics.AccuracyMetric("acc")
    labels = np.array([1, 2, 3, 4])
    preds = np.array([1, 0, 3, 4])
    weights = np.array([1.0, 1.0, 0.0, 2.0])
    metric.update(labels, preds, weights=weights)
    # sum(w * correct) / sum(w > 0) = (1 + 0 + 0 + 2) / 3
    assert float(metric) == pytest.approx(1.0)
    metric.reset()
    metric.update(labels, preds, weights=np.array([0.5, 1.0, 0.0, 0.0]))
    assert float(metric) == pytest.approx(0.25)


def test_accuracy_inside_a_traced_eval_step():
    model = compiled_mlp()
    model.eval()
    metric = cstorch.metrics.AccuracyMetric("accuracy")

    @cstorch.trace
    def eval_step(x, y):
        logits = model(x)
        metric(labels=y, predictions=logits.argmax(-1))
        return logits

    data = batches(6)
    correct = total = 0
    for x, y in data:
        eval_step(x, y)
        pred = np.asarray(mlp_apply(mlp_params(), x)).argmax(-1)
        correct += (pred == y).sum()
        total += y.size
    assert float(metric) == pytest.approx(correct / total, rel=1e-6)
    assert eval_step.num_compiles == 1


def test_metric_update_after_backward_is_deferred_in_order():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    metric = cstorch.metrics.AccuracyMetric("train_acc")

    @cstorch.trace
    def step(x, y):
        logits = model(x)
        loss = jnp.mean((logits - 1.0) ** 2)
        cstorch.backward(loss)
        optimizer.step()
        metric(labels=y, predictions=logits.argmax(-1))
        return loss

    x, y = batches(1)[0]
    step(x, y)
    pred = np.asarray(mlp_apply(mlp_params(), x)).argmax(-1)
    assert float(metric) == pytest.approx((pred == y).mean(), rel=1e-6)


def test_metric_names_are_unique():
    a = cstorch.metrics.AccuracyMetric("acc")
    b = cstorch.metrics.AccuracyMetric("acc")
    assert (a.name, b.name) == ("acc", "acc.1")
    assert cstorch.metrics.get_all_metrics()["acc.1"] is b
