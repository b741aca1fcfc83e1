"""A metric's ``dtype`` may be a torch dtype, as cstorch code passes it (Model Zoo's T5
evaluates with ``dtype=logits.dtype``, i.e. ``torch.float32``), a numpy / JAX dtype or a
dtype name. The value is then the float32 computation cast to that dtype, equal to
cstorch's ``compute()``, which is ``result.to(dtype)`` in torch.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cerebrax as cstorch  # noqa: E402

LABELS = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
PREDICTIONS = np.array([[1, 2, 0, 4], [5, 0, 7, 0]], np.int32)
WEIGHTS = np.array([[1, 1, 1, 0], [1, 1, 0.5, 1]], np.float32)
LOSSES = np.array([0.7, 1.3, 2.9], np.float32)  # one summed loss per batch

TORCH_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32]


def _torch_accuracy(dtype: torch.dtype) -> torch.Tensor:
    """cstorch's AccuracyMetric, computed in torch: float32 sums, then ``.to(dtype)``."""
    correct = (torch.from_numpy(LABELS) == torch.from_numpy(PREDICTIONS)).float()
    weights = torch.from_numpy(WEIGHTS)
    return ((correct * weights).sum() / (weights > 0).float().sum()).to(dtype)


def _torch_perplexity(dtype: torch.dtype) -> torch.Tensor:
    """cstorch's PerplexityMetric over the three batches of LABELS' shape."""
    total = torch.tensor(0, dtype=torch.float32)
    for loss in LOSSES:
        total.add_(torch.tensor(loss))
    return torch.exp(total / (3 * LABELS.size)).to(dtype)


def _same(value, reference: torch.Tensor) -> None:
    assert str(reference.dtype).removeprefix("torch.") == jnp.dtype(value.dtype).name
    assert float(value) == float(reference)  # bit for bit: the same float32 cast


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_accuracy_with_a_torch_dtype_equals_torch(dtype):
    accuracy = cstorch.metrics.AccuracyMetric("accuracy")
    accuracy.update(labels=LABELS, predictions=PREDICTIONS, weights=WEIGHTS, dtype=dtype)
    _same(accuracy.compute(), _torch_accuracy(dtype))
    assert float(accuracy) == float(_torch_accuracy(dtype))


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_perplexity_with_a_torch_dtype_equals_torch(dtype):
    perplexity = cstorch.metrics.PerplexityMetric("perplexity")
    for loss in LOSSES:
        value = perplexity(labels=LABELS, loss=loss, dtype=dtype)  # update and compute
    _same(value, _torch_perplexity(dtype))
    _same(perplexity.compute(), _torch_perplexity(dtype))


@pytest.mark.parametrize("dtype", [np.float16, np.dtype("float16"), jnp.bfloat16, "bfloat16",
                                   "float32", jnp.float32], ids=str)
def test_numpy_and_jax_dtypes_and_names(dtype):
    accuracy = cstorch.metrics.AccuracyMetric("accuracy")
    accuracy.update(labels=LABELS, predictions=PREDICTIONS, weights=WEIGHTS, dtype=dtype)
    name = jnp.dtype(dtype).name
    _same(accuracy.compute(), _torch_accuracy(getattr(torch, name)))


def test_torch_float64_is_the_float32_value():
    """With JAX's 64-bit types off, float64 stands for float32 (as torch_bridge maps it);
    the value is the same number cstorch's float32 computation cast to float64 gives."""
    accuracy = cstorch.metrics.AccuracyMetric("accuracy")
    accuracy.update(labels=LABELS, predictions=PREDICTIONS, weights=WEIGHTS,
                    dtype=torch.float64)
    assert float(accuracy) == float(_torch_accuracy(torch.float64))


class _T5Like(torch.nn.Module):
    """Updates its metrics in ``forward`` in eval mode with ``dtype=logits.dtype``."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 5)
        self.accuracy = cstorch.metrics.AccuracyMetric("eval/accuracy_lm")
        self.perplexity = cstorch.metrics.PerplexityMetric("eval/perplexity_lm")

    def forward(self, x, labels, mask):
        logits = self.head(x)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.long(),
                                                 reduction="none")
        if not self.training:
            metric_dtype = logits.dtype
            self.accuracy(labels=labels.clone(), predictions=logits.argmax(-1).int(),
                          weights=mask, dtype=metric_dtype)
            self.perplexity(labels=labels, loss=(loss * mask).sum(), weights=mask,
                            dtype=metric_dtype)
        return (loss * mask).sum() / mask.sum()


def test_metrics_in_a_compiled_forward_with_the_logits_dtype():
    cstorch.amp.set_half_dtype("float32")
    torch.manual_seed(0)
    model = _T5Like()
    reference = _T5Like()
    reference.load_state_dict(model.state_dict())
    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(model, backend)
    compiled.eval()

    @cstorch.trace
    def eval_step(x, labels, mask):
        return compiled(x, labels, mask)

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, 3, 4, generator=g), torch.randint(0, 5, (2, 3), generator=g),
                torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])) for _ in range(3)]
    correct = count = total_loss = 0.0
    with torch.no_grad():
        for x, labels, mask in batches:
            eval_step(x, labels, mask)
            logits = reference.head(x)
            correct += float(((logits.argmax(-1) == labels).float() * mask).sum())
            count += float((mask > 0).float().sum())
            total_loss += float((torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), labels, reduction="none") * mask).sum())
    assert model.accuracy.num_updates == 3
    assert float(model.accuracy) == pytest.approx(correct / count, rel=1e-6)
    assert float(model.perplexity) == pytest.approx(np.exp(total_loss / count), rel=1e-5)


@pytest.mark.parametrize("dtype", ["not_a_dtype", torch.device("cpu"), object()],
                         ids=["name", "device", "object"])
def test_an_unknown_dtype_is_refused_at_the_update(dtype):
    accuracy = cstorch.metrics.AccuracyMetric("accuracy")
    message = r"(?s)AccuracyMetric.update\(dtype=.*is not a dtype.*torch.float32"
    with pytest.raises(cstorch.ConfigError, match=message):
        accuracy.update(labels=LABELS, predictions=PREDICTIONS, dtype=dtype)
    assert accuracy.num_updates == 0  # nothing was accumulated


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_updates_with_half_precision_torch_tensors_equal_torch(dtype):
    """Torch tensors of a half dtype, as a model under autocast hands them over (Model
    Zoo's gpt2 passes ``weights`` as its bfloat16 mask): the metric computes on their
    values, as cstorch's does on the tensors. numpy has no bfloat16, so converting
    through it failed ("unsupported ScalarType BFloat16")."""
    accuracy = cstorch.metrics.AccuracyMetric("accuracy")
    accuracy.update(labels=torch.from_numpy(LABELS), predictions=torch.from_numpy(PREDICTIONS),
                    weights=torch.from_numpy(WEIGHTS).to(dtype))
    assert float(accuracy) == float(_torch_accuracy(torch.float32))
    perplexity = cstorch.metrics.PerplexityMetric("perplexity")
    for loss in LOSSES:
        perplexity.update(labels=torch.from_numpy(LABELS), loss=torch.tensor(loss).to(dtype))
    total = sum(float(torch.tensor(loss).to(dtype)) for loss in LOSSES)
    np.testing.assert_allclose(float(perplexity), np.exp(total / (3 * LABELS.size)),
                               rtol=1e-6)
