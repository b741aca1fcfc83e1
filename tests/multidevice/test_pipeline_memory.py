"""Pipeline mode holds the parameters and optimizer state split over its stage devices.

Between steps every parameter and every optimizer state leaf is stored split over the
``"stage"`` axis (each system keeps its own copy). Inside the step one all-to-all per
dtype sends each shard to the stage whose layers read it, and the transposed all-to-all
returns the gradient shards; the optimizer update runs on the shards. So one device
holds a quarter of the model on four stages, which, with stages balanced by parameter
count, is about the bytes of its own stage's layers.

The test model is the wafer tests' GPT (8 blocks, a head tied to the token embedding)
on ``num_csx=2`` x ``num_stages=4``, trained with AdamW. The numbers come from XLA's
compiled memory analysis (argument bytes of the per-device program) and the compiled
HLO. Training like one device (losses and final parameters, read back whole, to 1e-5)
is checked by the pipeline tests, which run unchanged on this layout.

Run in its own process:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/multidevice
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpt_model import adamw_step, gpt
from helpers import fresh_backend

import cerebrax as cstorch

VOCAB, SEQ, WIDTH, HEADS, BLOCKS, ROWS, STAGES = 64, 16, 64, 4, 8, 16, 4
PIPE = dict(execution_mode="pipeline", num_csx=2, num_stages=STAGES)
CIRCULAR = dict(PIPE, pipeline_schedule="circular", pipeline_repeats=2)


def _setup(layout: dict | None):
    backend = fresh_backend(layout)
    net = gpt(BLOCKS, vocab=VOCAB, seq=SEQ, width=WIDTH, heads=HEADS, seed=0)
    model = cstorch.compile(net, backend)
    return net, model, adamw_step(model, VOCAB, lr=1e-2, weight_decay=0.01)


def _batch(seed: int = 5):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, VOCAB, (ROWS, SEQ)).astype(np.int32),
            rng.integers(0, VOCAB, (ROWS, SEQ)).astype(np.int32))


def _stage_bytes(model, net, stages: int) -> list[int]:
    """Bytes of each stage's own parameters plus their AdamW moments (3 copies), from
    the stage split pipeline mode makes (layers balanced by parameter count)."""
    example = (jax.ShapeDtypeStruct((ROWS // 8, SEQ), jnp.int32),)
    layers = model._adapter.pipeline_layers({}, {}, example, {}, train=True)
    numel = dict(net.named_parameters(remove_duplicate=False))
    ranges = cstorch.wse.split_layers(layers.costs, stages)
    return [3 * 4 * sum(numel[n].numel() for n in set(layers.stage(lo, hi).params))
            for lo, hi in ranges]


@pytest.mark.parametrize("layout", [PIPE, CIRCULAR], ids=["gpipe", "circular"])
def test_each_device_holds_about_its_own_stages_bytes(layout):
    net, model, step = _setup(layout)
    compiled = step.lower(*_batch()).compile()
    report = cstorch.wse.report_for_compiled(step, compiled)
    # The parameters and the optimizer state are split four ways ...
    stored = step._state_shardings[step._refs.index(model._params["blocks.0.mlp.0.weight"])]
    assert "stage" in tuple(stored.spec)
    assert report.params_bytes * STAGES == pytest.approx(report.params_total_bytes, rel=0.01)
    assert report.optimizer_bytes * STAGES == pytest.approx(report.optimizer_total_bytes,
                                                            rel=0.01)
    # ... and XLA's per-device arguments (state and this system's rows of the batch) are
    # about one stage's own parameters and moments, for every stage.
    inputs = 2 * (ROWS // 2) * SEQ * 4
    held = report.xla_argument_bytes - inputs
    virtual = STAGES * (layout.get("pipeline_repeats") or 1)
    own = _stage_bytes(model, net, virtual)
    per_device = [sum(own[s::STAGES]) for s in range(STAGES)]  # device s: stages s, s+S, ...
    for s, mine in enumerate(per_device):
        assert 0.85 * mine <= held <= 1.15 * mine, (s, held, per_device)
    # A replicated layout would hold the whole model on every device.
    assert held < 0.3 * (report.params_total_bytes + report.optimizer_total_bytes)
    # One all-to-all brings the stages their (float32) parameters, its transpose returns
    # the gradient shards; no parameter is gathered onto every device.
    ops = re.findall(r" (all-to-all|all-gather|reduce-scatter)(?:-start)?\(",
                     compiled.as_text())
    assert ops.count("all-to-all") == 2 and "all-gather" not in ops, ops
