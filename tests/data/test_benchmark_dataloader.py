"""cstorch.utils.benchmark.benchmark_dataloader on a fake clock: counts, timings, rates,
batch structures, the printed summary and the errors."""

from __future__ import annotations

import io

import numpy as np
import pytest

import cerebrax as cstorch
from cerebrax.utils import benchmark

benchmark_dataloader = cstorch.utils.benchmark.benchmark_dataloader


class Ticking:
    """A fake clock that moves 1 s every time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def ticking(monkeypatch) -> Ticking:
    clock = Ticking()
    monkeypatch.setattr(benchmark, "clock", clock)
    return clock


def batches(n: int, rows: int = 4):
    return [{"x": np.zeros((rows, 3), np.float32), "y": np.arange(rows)} for _ in range(n)]


def test_counts_epochs_steps_and_one_batch_structure(ticking):
    out = io.StringIO()
    metrics = benchmark_dataloader(lambda: batches(5), num_epochs=3, steps_per_epoch=4,
                                   sampling_frequency=2, file=out)
    assert not metrics.is_partial
    assert [e.total_steps for e in metrics.epoch_metrics] == [4, 4, 4]
    assert metrics.total_steps == 12
    assert [b.epoch_step for b in metrics.epoch_metrics[0].batch_metrics] == [1, 2, 4]
    assert [b.global_step for b in metrics.epoch_metrics[2].batch_metrics] == [9, 10, 12]
    ((spec, seen),) = metrics.batch_specs.items()
    assert (seen.epoch, seen.epoch_step, seen.count) == (1, 1, 12)
    assert spec.batch_size == 4
    assert metrics.global_rate == pytest.approx(12 / metrics.total_time)
    assert metrics.global_sample_rate == pytest.approx(4 * metrics.global_rate)
    for epoch in metrics.epoch_metrics:
        assert epoch.total_time == epoch.iterator_creation + epoch.iteration_time
    assert sum(e.total_time for e in metrics.epoch_metrics) < metrics.total_time
    text = out.getvalue()
    assert "steps: 12 in 3 epoch(s)" in text and "samples/s" in text
    assert "12x (first at epoch 1, step 1): ['x']: float32[4, 3], ['y']: int64[4]" in text


def test_whole_epochs_by_default_and_varying_batches_have_no_sample_rate(ticking):
    data = batches(2, rows=4) + batches(1, rows=3)
    metrics = benchmark_dataloader(lambda: data, print_metrics=False)
    assert metrics.total_steps == 3 and len(metrics.epoch_metrics) == 1
    assert sorted(seen.count for seen in metrics.batch_specs.values()) == [1, 2]
    assert metrics.global_sample_rate is None
    # Step 1 of an epoch is always sampled; the default frequency is 100 steps.
    assert [b.epoch_step for b in metrics.epoch_metrics[0].batch_metrics] == [1]


def test_a_torch_dataloader_is_timed_like_any_iterable(ticking):
    torch = pytest.importorskip("torch")
    dataset = torch.utils.data.TensorDataset(torch.zeros(10, 2), torch.arange(10))
    metrics = benchmark_dataloader(
        lambda: torch.utils.data.DataLoader(dataset, batch_size=5), num_epochs=2,
        print_metrics=False)
    assert metrics.total_steps == 4
    ((spec, _),) = metrics.batch_specs.items()
    assert str(spec) == "[0]: torch.float32[5, 2], [1]: torch.int64[5]"


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_epochs=0), r"num_epochs=...\) must be an integer > 0"),
    (dict(steps_per_epoch=0), r"steps_per_epoch=...\) must be an integer > 0"),
    (dict(sampling_frequency=-1), r"sampling_frequency=...\) must be an integer >= 0"),
    (dict(profile_activities=["memory"]), "no host activity profilers"),
])
def test_argument_errors(kwargs, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        benchmark_dataloader(lambda: batches(1), print_metrics=False, **kwargs)


def test_an_exhausted_iterator_fails_in_its_second_epoch():
    with pytest.raises(cstorch.ConfigError, match="no batch in epoch 2"):
        benchmark_dataloader(lambda: iter(batches(2)), num_epochs=2, print_metrics=False)


def test_a_loader_error_names_the_epoch_and_step():
    def broken():
        yield batches(1)[0]
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone") as info:
        benchmark_dataloader(broken, print_metrics=False)
    assert "at epoch 1, step 2 (global step 2)" in "\n".join(info.value.__notes__)
