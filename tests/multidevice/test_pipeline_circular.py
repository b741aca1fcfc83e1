"""Pipeline mode's circular schedule, and the schedule each device executes (8 CPU devices).

``pipeline_schedule="circular"`` cuts the layers into ``S * V`` virtual stages, device
``s`` runs stages ``s, s + S, ...``, and micro-batch ``m`` runs its repeat ``v`` on
device ``s`` at tick ``t = (m mod S) + (m div S) * S * V + v * S + s`` (GPipe: ``V = 1``,
``t = m + s``). It must train like one device, as GPipe does (the reference runs of
test_pipeline.py), and its executed schedule, as :func:`recording_schedule` reports it,
must be that closed form: ``M * V + S - 1`` ticks, each (micro-batch, virtual stage)
once on its device, ``S * (S - 1)`` idle (device, tick) slots per system.

Run in its own process:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/multidevice
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import batches, fresh_backend, mlp_apply, mlp_params
from test_pipeline import (
    STEPS,
    _assert_same,
    _collectives_in_branches,
    _data,
    _dense,
    _forward_error,
    _layered_mlp,
    _linear,
    _loss,
    _model,
    _reference,
)

import cerebrax as cstorch
from cerebrax.wse import recording_schedule

MLP8_SIZES = (8,) + (16,) * 7 + (4,)  # eight layers: S=4 x V=2 virtual stages
CIRCULAR4 = dict(execution_mode="pipeline", num_stages=4, micro_batch_size=8,
                 pipeline_schedule="circular", pipeline_repeats=2)


def _mlp8(pipelined: bool) -> cstorch.FunctionalModel:
    """An eight-layer MLP: as layers (pipelined) or as one function (the reference)."""
    params = mlp_params(0, MLP8_SIZES)
    if not pipelined:
        return cstorch.FunctionalModel(mlp_apply, params)
    return cstorch.FunctionalModel(layers={
        name: (_linear if name == "fc8" else _dense, p) for name, p in params.items()})


def _run(cluster: dict | None, model, opt_kind: str, data: list, *, chunks: int = 1):
    """Trains ``model`` on ``data`` as test_pipeline's ``_train`` does; returns the
    losses, the final state and the step. ``chunks``: the model is called on that many
    slices."""
    compiled = cstorch.compile(model, fresh_backend(cluster))
    if opt_kind == "sgd":
        optimizer = cstorch.optim.SGD(compiled.parameters(), lr=0.1, momentum=0.9)
    else:
        optimizer = cstorch.optim.AdamW(compiled.parameters(), lr=1e-2, weight_decay=0.01)

    @cstorch.trace
    def training_step(x, y):
        logits = jnp.concatenate([compiled(part) for part in jnp.split(x, chunks)])
        loss = _loss(logits, y)
        cstorch.backward(loss)
        optimizer.step()
        return loss

    losses = [float(training_step(x, y)) for x, y in data]
    return np.array(losses), compiled.state_dict(), training_step


@pytest.fixture(autouse=True)
def _clean():
    yield
    cstorch.reset()


# ---- the schedule's laws ----------------------------------------------------------------
def _closed_form(num_stages: int, repeats: int, count: int) -> np.ndarray:
    """``[S, ticks, 2]``: (virtual stage, micro-batch) per device and tick, -1 idle."""
    table = np.full((num_stages, count * repeats + num_stages - 1, 2), -1)
    for m in range(count):
        for v in range(repeats):
            for s in range(num_stages):
                t = m % num_stages + m // num_stages * num_stages * repeats + v * num_stages + s
                table[s, t] = (v * num_stages + s, m)
    return table


def _assert_valid_schedule(record: np.ndarray, num_stages: int, repeats: int, count: int):
    """One system's ``[S, ticks, 2]`` record: a complete, conflict-free pipeline schedule."""
    virtual, ticks = num_stages * repeats, count * repeats + num_stages - 1
    assert record.shape == (num_stages, ticks, 2)
    when = {}
    for s, t in zip(*np.nonzero(record[..., 0] >= 0)):
        k, m = record[s, t]
        assert k % num_stages == s, (k, s)  # virtual stage k lives on device k mod S
        assert (m, k) not in when, (m, k)  # runs once
        when[m, k] = t
    assert set(when) == {(m, k) for m in range(count) for k in range(virtual)}
    for (m, k), t in when.items():
        if k:  # the carry arrives from the device before, one tick earlier (the ring)
            assert when[m, k - 1] == t - 1, (m, k)
        if m:  # each stage takes the micro-batches in order (buffer updates)
            assert when[m - 1, k] < t, (m, k)
    idle = int((record[..., 0] < 0).sum())
    assert (record[..., 1] < 0).sum() == idle  # idle slots name no micro-batch
    assert idle == num_stages * ticks - count * virtual == num_stages * (num_stages - 1)
    assert idle / record[..., 0].size == (num_stages - 1) / (count * repeats + num_stages - 1)
    np.testing.assert_array_equal(record, _closed_form(num_stages, repeats, count))


@pytest.mark.parametrize("fields, repeats", [
    (dict(num_stages=4, micro_batch_size=8), 1),  # GPipe, M = 4
    (dict(num_stages=3, micro_batch_size=8), 1),  # GPipe, M = 4 not a multiple of S
    (dict(num_stages=4, micro_batch_size=4, pipeline_schedule="circular"), 2),  # M = 8
    (dict(num_csx=2, num_stages=2, micro_batch_size=8, pipeline_schedule="circular",
          pipeline_repeats=4), 4),  # M = 2 per system
])
def test_recorded_schedule_is_the_closed_form(fields, repeats):
    fields = dict(execution_mode="pipeline", **fields)
    with recording_schedule() as records:
        _run(fields, _mlp8(True), "sgd", batches(1))
    (record,) = records  # one run of one step
    num_csx, num_stages = fields.get("num_csx", 1), fields["num_stages"]
    count = 32 // num_csx // fields["micro_batch_size"]
    assert record.shape[:2] == (num_csx, num_stages)
    for c in range(num_csx):
        _assert_valid_schedule(record[c], num_stages, repeats, count)


def test_recording_is_off_outside_the_context():
    with recording_schedule() as records:
        pass
    _run(dict(CIRCULAR4), _mlp8(True), "sgd", batches(1))
    assert records == []


# ---- training equals one device ---------------------------------------------------------
def test_circular_mlp_trains_like_one_device():
    ref_losses, ref_state, _ = _run(None, _mlp8(False), "sgd", batches(STEPS))
    with recording_schedule() as records:
        losses, state, _ = _run(dict(CIRCULAR4), _mlp8(True), "sgd", batches(STEPS))
    _assert_same(losses, state, ref_losses, ref_state)
    assert len(records) == STEPS  # the compiled step reports each time it runs
    _assert_valid_schedule(records[-1][0], 4, 2, 4)


@pytest.mark.parametrize("kind", ["gpt", "gpt_gates"])
def test_circular_gpt_trains_like_one_device(kind):
    """Ten layers (embeddings, blocks, a head tied to the embedding) in 8 virtual stages;
    with gates, 0-dim parameters that every stage device stores whole."""
    ref_losses, ref_state = _reference(kind, "adamw")
    losses, state, step = _run(dict(CIRCULAR4), _model(kind, True), "adamw", _data(kind))
    _assert_same(losses, state, ref_losses, ref_state)
    assert _collectives_in_branches(step.lower(*_data(kind, 1)[0]).compile().as_text()) == set()


def _batchnorm_mlp():
    """Eight layers, one per virtual stage: BatchNorm at stage 1 (device 1, chunk 0) and
    stage 4 (device 0, chunk 1)."""
    from flax import nnx

    rngs = nnx.Rngs(0)
    # No bias before BatchNorm: its gradient is 0, its value rounding noise.
    return nnx.Sequential(
        nnx.Linear(8, 16, use_bias=False, rngs=rngs), nnx.BatchNorm(16, momentum=0.9, rngs=rngs),
        jnp.tanh, nnx.Linear(16, 16, use_bias=False, rngs=rngs),
        nnx.BatchNorm(16, momentum=0.9, rngs=rngs), jnp.tanh,
        nnx.Linear(16, 16, rngs=rngs), nnx.Linear(16, 4, rngs=rngs),
    )


def test_circular_batchnorm_in_both_chunks_equals_calls_one_after_the_other():
    """4 micro-batches: the reference calls the model on the 4 slices in order."""
    ref_losses, ref_state, _ = _run(None, _batchnorm_mlp(), "sgd", batches(STEPS), chunks=4)
    losses, state, _ = _run(dict(CIRCULAR4), _batchnorm_mlp(), "sgd", batches(STEPS))
    _assert_same(losses, state, ref_losses, ref_state)
    assert {"layers.1.mean", "layers.4.var"} <= set(state)


# ---- misconfigurations ------------------------------------------------------------------
def test_circular_needs_micro_batches_in_groups_of_stages():
    x = np.zeros((32, 8), np.float32)
    message = _forward_error(dict(CIRCULAR4, micro_batch_size=16), _layered_mlp(0), x)
    assert "multiple of 4 micro-batches" in message and "make 2" in message
    assert "set micro_batch_size to 8" in message and "[1, 2, 4, 8]" in message
    message = _forward_error(dict(CIRCULAR4, num_stages=3), _layered_mlp(0), x)
    assert "num_csx x num_stages = 3" in message and "pipeline_schedule='gpipe'" in message


def test_circular_needs_a_layer_per_virtual_stage():
    x = np.zeros((32, 8), np.float32)
    message = _forward_error(dict(CIRCULAR4, num_stages=2, pipeline_repeats=4),
                             _layered_mlp(0), x)
    assert "num_stages x pipeline_repeats = 8 virtual stages" in message
    assert "only 4 layers (fc1, fc2, fc3, fc4)" in message
    assert "set pipeline_repeats to at most 2" in message
