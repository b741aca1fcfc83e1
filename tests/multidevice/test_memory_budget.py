"""A per-device memory budget (``ClusterConfig(device_memory=...)``) on 8 CPU devices.

The demonstration: a GPT-style torch model whose parameters plus AdamW state do not fit
the budget of one device. In replica mode (a full copy per device) the first call of
the training step is refused before anything runs, with the per-device numbers of XLA's
memory analysis and the layout that would fit. In weight-streaming mode over the 8
devices the same step fits and trains, and its losses equal the single-device run's
(float32, rel 1e-5). A compile-only run (``cerebrax compile``'s backend) is refused the
same way.

Run in its own process:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/multidevice
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from gpt_model import adamw_step, gpt
from helpers import fresh_backend, rel_err

import cerebrax as cstorch

VOCAB, SEQ, WIDTH, HEADS, BLOCKS, ROWS = 64, 16, 64, 4, 4, 8
MiB = 2**20
BUDGET = "1.5MiB"
REPLICA = dict(execution_mode="replica", num_replicas=8, device_memory=BUDGET)
STREAMING = dict(execution_mode="weight_streaming", max_wgt_servers=8, device_memory=BUDGET)


def _setup(layout: dict | None):
    backend = fresh_backend(layout)
    net = gpt(BLOCKS, vocab=VOCAB, seq=SEQ, width=WIDTH, heads=HEADS, seed=0)
    model = cstorch.compile(net, backend)
    return net, adamw_step(model, VOCAB, lr=1e-2, weight_decay=0.01)


def _batches(n: int):
    rng = np.random.default_rng(5)
    return [(rng.integers(0, VOCAB, (ROWS, SEQ)).astype(np.int32),
             rng.integers(0, VOCAB, (ROWS, SEQ)).astype(np.int32)) for _ in range(n)]


def _losses(layout: dict | None, steps: int = 8) -> list[float]:
    _, step = _setup(layout)
    return [float(step(x, y)) for x, y in _batches(steps)]


def _mib(text: str, label: str) -> float:
    return float(re.search(rf"{label} ([0-9.]+) MiB", text).group(1))


def test_the_model_and_its_adamw_state_exceed_the_budget():
    net, _ = _setup(None)
    params = sum(p.numel() * p.element_size() for p in net.parameters())
    budget = cstorch.distributed.ClusterConfig(device_memory=BUDGET).device_memory
    assert budget == 1.5 * MiB
    assert 3 * params > budget  # weights, exp_avg, exp_avg_sq


def test_replica_mode_is_refused_before_running_with_the_numbers():
    net, step = _setup(REPLICA)
    before = [p.detach().clone() for p in net.parameters()]
    x, y = _batches(1)[0]
    with pytest.raises(cstorch.ConfigError) as info:
        step(x, y)
    text = str(info.value)
    report = cstorch.wse.memory_report(step, x, y)
    assert "'replica' layout on 8 device(s)" in text
    assert "device_memory=1.50 MiB" in text
    # The numbers are the memory report's: full copies of the state on every device.
    assert report.params_bytes == report.params_total_bytes
    assert _mib(text, "parameters") == pytest.approx(report.params_bytes / MiB, abs=0.005)
    assert _mib(text, "optimizer state") == pytest.approx(report.optimizer_bytes / MiB,
                                                          abs=0.005)
    assert _mib(text, "needs") == pytest.approx(report.peak_bytes / MiB, abs=0.005)
    assert report.peak_bytes > 1.5 * MiB
    assert "execution_mode='weight_streaming' with max_wgt_servers >= " in text
    # Nothing ran: the step never built its state, and the torch weights are untouched.
    assert step.num_compiles == 1
    for old, new in zip(before, net.parameters()):
        assert (old == new).all()


def test_weight_streaming_fits_and_trains_like_one_device():
    _, step = _setup(STREAMING)
    x, y = _batches(1)[0]
    report = cstorch.wse.memory_report(step, x, y)
    assert report.peak_bytes <= 1.5 * MiB, report.format()
    assert report.params_bytes * 8 == pytest.approx(report.params_total_bytes, rel=0.01)
    streamed = _losses(STREAMING)
    single = _losses(None)
    assert streamed[-1] < streamed[0] / 2  # it learns
    assert rel_err(streamed, single) <= 1e-5, (streamed, single)


def test_compile_only_run_is_refused_too(tmp_path):
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend("CSX", compile_only=True, compile_dir=str(tmp_path),
                              cluster_config=cstorch.distributed.ClusterConfig(**REPLICA))
    model = cstorch.compile(gpt(BLOCKS, vocab=VOCAB, seq=SEQ, width=WIDTH, heads=HEADS),
                            backend)
    training_step = adamw_step(model, VOCAB, lr=1e-2)

    with pytest.raises(cstorch.ConfigError, match="more than ClusterConfig"):
        training_step(*_batches(1)[0])
    # The memory report was written before the refusal, for the user to read.
    assert "mode replica" in (tmp_path / "training_step.memory.txt").read_text()
