"""A metric is a torch module where torch is loaded, as cstorch's metrics are.

cstorch's ``Metric`` subclasses ``torch.nn.Module``: a metric assigned to a model's
attribute is a submodule, so ``model.modules()`` lists it. Model Zoo's evaluation callback
finds a model's metrics that way and logs them. The metric must still leave the model's
parameters, state dict, device moves and train/eval switches as they were.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cerebrax as cstorch  # noqa: E402


class Classifier(torch.nn.Module):
    """A model that updates its own metrics in ``forward`` in eval mode (Model Zoo's way)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.accuracy = cstorch.metrics.AccuracyMetric(name="eval/accuracy")
        self.perplexity = cstorch.metrics.PerplexityMetric(name="eval/perplexity")

    def forward(self, x, y):
        logits = self.fc(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        if not self.training:
            self.accuracy(labels=y, predictions=logits.argmax(-1))
            self.perplexity(labels=y, loss=torch.nn.functional.cross_entropy(
                logits, y, reduction="none"))
        return loss


def torch_metrics(model, batches):
    """Accuracy and perplexity of the batches, in torch alone (the reference)."""
    correct = total = loss_sum = 0.0
    with torch.no_grad():
        for x, y in batches:
            logits = model.fc(x)
            correct += (logits.argmax(-1) == y).sum().item()
            total += y.numel()
            loss_sum += torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
    return correct / total, float(np.exp(loss_sum / total))


def evaluation_callback(model):
    """What Model Zoo's ModelEvalMetrics does after validation: every metric submodule
    that was updated, by name, then reset."""
    found = {}
    for module in model.modules():
        if isinstance(module, cstorch.metrics.Metric) and module.num_updates:
            found[module.name] = float(module)
            module.reset()
    return found


def test_a_metric_attribute_is_a_submodule_and_changes_nothing_else():
    torch.manual_seed(0)
    model = Classifier()
    assert isinstance(model.accuracy, torch.nn.Module)
    assert isinstance(model.accuracy, cstorch.metrics.AccuracyMetric)
    assert [type(m).__name__ for m in model.modules()] == [
        "Classifier", "Linear", "AccuracyMetric", "PerplexityMetric"]
    assert list(model.state_dict()) == ["fc.weight", "fc.bias"]
    assert [n for n, _ in model.named_parameters()] == ["fc.weight", "fc.bias"]
    model.to("cpu").eval()
    assert model.accuracy.training is False
    assert repr(model.accuracy) == "AccuracyMetric('eval/accuracy')"
    # the state dict loads back, strictly, with the metrics in the model
    model.load_state_dict(Classifier().state_dict(), strict=True)


def test_the_model_zoo_evaluation_callback_finds_the_metrics_of_a_compiled_model():
    torch.manual_seed(0)
    model = Classifier()
    batches = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(3)]
    want_accuracy, want_perplexity = torch_metrics(model, batches)

    compiled = cstorch.compile(model, backend="CPU")

    @cstorch.trace
    @torch.no_grad()
    def eval_step(x, y):
        return compiled(x, y)

    model.eval()
    for x, y in batches:
        eval_step(x, y)
    found = evaluation_callback(model)
    assert set(found) == {"eval/accuracy", "eval/perplexity"}
    np.testing.assert_allclose(found["eval/accuracy"], want_accuracy, rtol=1e-6)
    np.testing.assert_allclose(found["eval/perplexity"], want_perplexity, rtol=1e-5)
    assert model.accuracy.num_updates == 0  # reset by the callback


def test_a_metric_module_pickles_and_copies_with_its_state():
    metric = cstorch.metrics.AccuracyMetric(name="copied")
    metric.update(np.array([1, 0, 1]), np.array([1, 1, 1]))
    for other in (pickle.loads(pickle.dumps(metric)), copy.deepcopy(metric)):
        assert isinstance(other, torch.nn.Module)
        assert isinstance(other, cstorch.metrics.AccuracyMetric)
        assert float(other) == pytest.approx(2 / 3)
        assert dict(other.named_modules()) == {"": other}
