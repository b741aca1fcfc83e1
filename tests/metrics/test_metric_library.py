"""Every metric of the library against a plain NumPy reference, eagerly and traced.

Each case draws several random batches, feeds them to the metric (eagerly, then inside
one ``@cstorch.trace`` evaluation step that compiles once) and compares the value with
a NumPy reference computed from all batches at once, written from the formula.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import compiled_mlp
from metric_cases import CASES, NUM_BATCHES, Case, draw, reference

import cerebrax as cstorch


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
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
    assert step.num_compiles == 1  # the count is state: the step does not retrace


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
