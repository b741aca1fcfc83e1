"""Weight streaming on 8 CPU devices, checked in the program XLA compiles.

A GPT-style torch model (an ``nn.ModuleList`` of identical blocks, a causal mask carried
next to the residual stream, a head tied to the embedding) with 4, 8, 16 and 32 blocks
in ``ClusterConfig(execution_mode="weight_streaming", max_wgt_servers=8)``:

- the blocks run as one loop in the forward and one in the backward pass, each with the
  blocks as trip count; per iteration the forward loop all-gathers every parameter of
  the block once, the backward loop gathers the weights again and reduce-scatters
  every parameter's gradient once; no all-reduce moves more than a scalar;
- per-device peak memory (XLA's arguments plus temporaries) stays within
  total / 8 + 2 blocks + activations (+10%), where total is the parameters, their
  gradients and the AdamW state; it grows by one block's shard of those per block;
- the compiled loops are the same for every depth (how compile time grows with depth is a
  benchmark figure, ``benchmarks/bench_wstream.py``, not a test);
- training gives the losses and parameters of one device (float32, rel 1e-5).

Run in its own process:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/multidevice
"""

from __future__ import annotations

import collections
import functools
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import fresh_backend, rel_err, xent
from gpt_model import gpt

import cerebrax as cstorch

VOCAB, SEQ, WIDTH, HEADS, ROWS = 32, 8, 64, 2, 8  # ROWS: the batch, one row per device
# 32 blocks joins with CEREBRAX_WSTREAM_ALL=1 (its compiles cost the suite about a
# minute on 2 cores; it passed with the others when the streaming layout was merged).
DEPTHS = (4, 8, 16, 32) if os.environ.get("CEREBRAX_WSTREAM_ALL") == "1" else (4, 8, 16)
WS8 = dict(execution_mode="weight_streaming", max_wgt_servers=8)
WS2X4 = dict(execution_mode="weight_streaming", num_csx=2, max_wgt_servers=4)


# ---- the model --------------------------------------------------------------------------
def _gpt(blocks: int, seed: int = 0):
    return gpt(blocks, vocab=VOCAB, seq=SEQ, width=WIDTH, heads=HEADS, seed=seed)


def _loss(logits, y):
    return xent(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _setup(layout: dict | None, blocks: int):
    backend = fresh_backend(layout)
    net = _gpt(blocks)
    model = cstorch.compile(net, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)

    @cstorch.trace
    def training_step(x, y):
        loss = _loss(model(x), y)
        cstorch.backward(loss)
        optimizer.step()
        return loss

    return net, model, training_step, backend


def _batches(n: int, rows: int = ROWS):
    rng = np.random.default_rng(3)
    return [(rng.integers(0, VOCAB, (rows, SEQ)).astype(np.int32),
             rng.integers(0, VOCAB, (rows, SEQ)).astype(np.int32)) for _ in range(n)]


# ---- compiled programs, once per depth ---------------------------------------------------
@functools.cache
def _compiled(blocks: int, layout: tuple = tuple(WS8.items())) -> dict:
    """Lowers and compiles one AdamW step of the GPT; what the tests read of it."""
    net, _, step, backend = _setup(dict(layout), blocks)
    x, y = _batches(1)[0]
    compiled = step.lower(x, y).compile()
    memory = cstorch.wse.report_for_compiled(step, compiled)
    block = {name: tuple(p.shape) for name, p in net.blocks[0].named_parameters()}
    shards = {name: backend.layout.state_sharding(jax.ShapeDtypeStruct(s, jnp.float32))
              .shard_shape(s) for name, s in block.items()}
    result = dict(
        hlo=compiled.as_text(), report=cstorch.wse.parse_collectives(compiled.as_text()),
        memory=memory, block=block, shards=shards,
        block_bytes=4 * sum(math.prod(s) for s in block.values()),
    )
    cstorch.reset()
    return result


def _dims(shape: str) -> tuple[int, ...]:
    """``"f32[96,32]{1,0}"`` -> ``(96, 32)``."""
    inside = re.match(r"\w+\[([\d,]*)\]", shape).group(1)
    return tuple(int(d) for d in inside.split(",") if d)


def _block_loops(report) -> tuple:
    """The forward and the backward loop over the blocks (those that all-gather)."""
    loops = [loop for loop in report.loops if loop.count("all-gather")]
    assert len(loops) == 2, report.format()
    forward, backward = sorted(loops, key=lambda loop: loop.count("reduce-scatter"))
    return forward, backward


def _activation_bytes(blocks: int, rows: int) -> int:
    """An upper estimate of the activations one device holds (float32, ``rows`` rows):
    every block's input saved for the backward pass, the values inside one block
    (layer norms, q/k/v, attention output and projection, the 4x wide MLP before and
    after GELU, the residual sums; scores and probabilities per head) and the logits
    with their softmax and gradient."""
    carries = (blocks + 2) * SEQ * WIDTH
    inside = SEQ * 16 * WIDTH + 2 * HEADS * SEQ * SEQ
    return 4 * rows * (carries + inside + 3 * SEQ * VOCAB)


@pytest.fixture(autouse=True)
def _clean():
    yield
    cstorch.reset()


# ---- the communication pattern ----------------------------------------------------------
@pytest.mark.parametrize("blocks", DEPTHS)
def test_each_block_is_gathered_once_per_pass_and_reduce_scattered(blocks):
    got = _compiled(blocks)
    forward, backward = _block_loops(got["report"])
    assert forward.trip_count == backward.trip_count == blocks
    gathered = lambda loop: sorted(_dims(c.shape) for c in loop.collectives  # noqa: E731
                                   if c.kind == "all-gather")
    # Forward: every parameter of the block, whole, once; no gradient traffic.
    assert gathered(forward) == sorted(got["block"].values()), forward
    assert forward.count("reduce-scatter") == forward.count("all-reduce") == 0
    # Backward: the weights again (each at most once; every matrix is needed), and
    # every parameter's gradient reduce-scattered once, to its shard.
    again = collections.Counter(gathered(backward))
    assert not again - collections.Counter(got["block"].values()), again
    matrices = collections.Counter(s for s in got["block"].values() if len(s) == 2)
    assert not matrices - again, again
    scattered = sorted(_dims(c.shape) for c in backward.collectives
                       if c.kind == "reduce-scatter")
    assert scattered == sorted(got["shards"].values()), scattered
    assert all(c.group_size == 8 for c in backward.collectives if not c.trivial)


@pytest.mark.parametrize("blocks", DEPTHS)
def test_no_all_reduce_of_a_gradient(blocks):
    report = _compiled(blocks)["report"]
    reduced = [c for c in report.outside if c.kind == "all-reduce" and not c.trivial]
    reduced += [c for loop in report.loops for c in loop.collectives
                if c.kind == "all-reduce" and not c.trivial]
    assert reduced and all(_dims(c.shape) == () for c in reduced), reduced  # the loss


def test_the_program_does_not_grow_with_depth():
    reports = [_compiled(blocks) for blocks in DEPTHS]
    outside = {(r["report"].count("all-gather"), r["report"].count("reduce-scatter"))
               for r in reports}
    assert len(outside) == 1, outside  # the layers around the blocks, the same for all
    bodies = []
    for r in reports:
        forward, backward = _block_loops(r["report"])
        bodies.append((_instructions(r["hlo"], forward.body),
                       _instructions(r["hlo"], backward.body)))
    assert all(b == bodies[0] for b in bodies), bodies


def _instructions(hlo: str, computation: str) -> collections.Counter:
    """Opcodes of a computation's instructions, without the loop state's plumbing (one
    get-tuple-element per parameter shard the loop carries: those grow with depth)."""
    body = hlo.split(f"\n%{computation} ", 1)[1].split("\n}\n", 1)[0]
    ops = re.findall(r"^\s*(?:ROOT )?%\S+ = .*? ([a-z][\w\-]*)\(", body, re.MULTILINE)
    return collections.Counter(op for op in ops
                               if op not in ("get-tuple-element", "tuple", "parameter"))


# ---- memory -----------------------------------------------------------------------------
@pytest.mark.parametrize("blocks", DEPTHS)
def test_peak_memory_per_device_is_within_the_streaming_bound(blocks):
    got = _compiled(blocks)
    memory = got["memory"]
    assert memory.params_bytes * 8 == pytest.approx(memory.params_total_bytes, rel=0.01)
    peak = memory.xla_argument_bytes + memory.temp_bytes
    # What ZeRO-3 shards: the parameters, their gradients and the optimizer state.
    total = 2 * memory.params_total_bytes + memory.optimizer_total_bytes
    bound = total / 8 + 2 * got["block_bytes"] + _activation_bytes(blocks, ROWS // 8)
    assert peak <= 1.1 * bound, (peak, bound, memory.format())
    # Far below what one device holds without streaming (total + activations).
    assert peak < total / 3


def test_peak_memory_grows_by_one_block_shard_per_block():
    got = {blocks: _compiled(blocks) for blocks in DEPTHS}
    peak = {b: g["memory"].xla_argument_bytes + g["memory"].temp_bytes
            for b, g in got.items()}
    # One block's parameters, gradients and two AdamW moments, over 8 devices.
    shard = 4 * got[4]["block_bytes"] / 8
    for lo, hi in zip(DEPTHS, DEPTHS[1:]):
        per_block = (peak[hi] - peak[lo]) / (hi - lo)
        assert per_block == pytest.approx(shard, rel=0.15), (lo, hi, per_block, shard)


# ---- numerics ---------------------------------------------------------------------------
def _train(layout: dict | None, blocks: int = 4, steps: int = 10, rows: int = ROWS):
    _, model, step, backend = _setup(layout, blocks)
    losses = [float(step(x, y)) for x, y in _batches(steps, rows)]
    return np.array(losses), model.state_dict(), step, backend


@pytest.mark.parametrize("layout", [WS8, WS2X4], ids=["ws8", "ws2x4"])
def test_streamed_gpt_trains_like_one_device(layout):
    ref_losses, ref_state, _, _ = _train(None)
    losses, state, step, backend = _train(layout)
    assert rel_err(losses, ref_losses) <= 1e-5, (losses, ref_losses)
    # The gradient sums rows in another order (per device, then over devices), and
    # AdamW's step is about lr wherever a gradient is near zero: parameters agree to
    # rounding noise scaled up by the steps.
    for name in ref_state:
        assert rel_err(state[name], ref_state[name]) <= 1e-4, name
    # Parameters and AdamW moments stay sharded over the weight servers.
    assert all("wgt" in p._value.sharding.spec for p in step._diff_refs)
    x, y = _batches(1)[0]
    report = cstorch.wse.collective_report(step, x, y)
    forward, backward = _block_loops(report)
    assert forward.trip_count == 4
    if backend.wafer.num_csx == 2:
        # Two systems: after the reduce-scatter over "wgt", each gradient shard is summed
        # over "csx", once: the bytes all-reduced are the parameter shards (1/4 of the
        # parameters; the whole gradient would be 4x that), plus the loss.
        memory = cstorch.wse.memory_report(step, x, y)
        reduced = report.executed_bytes("all-reduce")
        assert memory.params_bytes <= reduced <= memory.params_bytes + 16, report
        assert 4 * memory.params_bytes == pytest.approx(memory.params_total_bytes, rel=0.01)


def _streamed_like_one_device(model) -> tuple:
    """Trains ``model()`` (a layered model: 8 inputs, 4 classes) for 10 steps on one
    device and in WS8, checks that losses and final state agree, and returns the
    streamed step's forward and backward loops over the blocks."""

    def train(layout):
        backend = fresh_backend(layout)
        compiled = cstorch.compile(model(), backend)
        optimizer = cstorch.optim.SGD(compiled.parameters(), lr=0.1, momentum=0.9)

        @cstorch.trace
        def step(x, y):
            loss = xent(compiled(x), y)
            cstorch.backward(loss)
            optimizer.step()
            return loss

        data = np.random.default_rng(1)
        batches = [(data.normal(size=(32, 8)).astype(np.float32),
                    data.integers(0, 4, 32).astype(np.int32)) for _ in range(10)]
        losses = [float(step(x, y)) for x, y in batches]
        return np.array(losses), compiled.state_dict(), step, batches[0]

    ref_losses, ref_state, _, _ = train(None)
    losses, state, step, (x, y) = train(WS8)
    assert rel_err(losses, ref_losses) <= 1e-5
    for name in ref_state:
        assert rel_err(state[name], ref_state[name]) <= 1e-5, name
    forward, backward = _block_loops(cstorch.wse.collective_report(step, x, y))
    return forward, backward


def test_layered_functional_model_scans_identical_layers():
    """``FunctionalModel(layers=...)``: equal consecutive layers run as one loop."""

    def dense(p, x):
        return jnp.tanh(x @ p["weight"] + p["bias"])

    def head(p, x):
        return x @ p["weight"]

    sizes = [(8, 16)] + [(16, 16)] * 5

    def model():
        rng = np.random.default_rng(0)
        layers = {f"fc{i}": (dense, {"weight": rng.normal(size=s).astype(np.float32) / 4,
                                     "bias": np.full(s[1], 0.01 * i, np.float32)})
                  for i, s in enumerate(sizes)}
        layers["out"] = (head, {"weight": rng.normal(size=(16, 4)).astype(np.float32)})
        return cstorch.FunctionalModel(layers=layers)

    forward, backward = _streamed_like_one_device(model)
    # fc0 takes the model's input, fc1..fc5 are one scan, the head is unrolled.
    assert forward.trip_count == backward.trip_count == 5
    assert forward.count("all-gather") == 2 and backward.count("reduce-scatter") == 2


def test_nnx_sequential_scans_identical_blocks():
    """An ``nnx.Sequential`` whose middle entries are equal modules: one loop, like one
    device."""
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.fc = nnx.Linear(16, 16, rngs=rngs)

        def __call__(self, x):
            return jnp.tanh(self.fc(x))

    def model():
        rngs = nnx.Rngs(0)
        return nnx.Sequential(nnx.Linear(8, 16, rngs=rngs),
                              *[Block(rngs) for _ in range(5)],
                              nnx.Linear(16, 4, rngs=rngs))

    forward, backward = _streamed_like_one_device(model)
    # layers.0 takes the model's input; layers.1..5 (the blocks) are one scan; the
    # head, a Linear of another shape, is unrolled.
    assert forward.trip_count == backward.trip_count == 5


# ---- where the plan does not apply: the sharded layout, unchanged results ----------------
def test_a_batch_that_does_not_split_over_all_devices_runs_sharded():
    ref_losses, _, _, _ = _train(None, rows=4, steps=4)
    losses, _, step, _ = _train(WS8, rows=4, steps=4)  # 4 rows, 8 devices
    assert rel_err(losses, ref_losses) <= 1e-5
    x, y = _batches(1, rows=4)[0]
    assert not [loop for loop in cstorch.wse.collective_report(step, x, y).loops
                if loop.count("all-gather")]


def test_batchnorm_in_train_mode_runs_sharded_and_matches_one_device():
    """A layer that updates buffers (running statistics of the whole batch) falls back."""
    torch = pytest.importorskip("torch")
    from torch import nn

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh(),
                             nn.Linear(16, 4))

    def train(layout):
        backend = fresh_backend(layout)
        model = cstorch.compile(net(), backend)
        optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

        @cstorch.trace
        def step(x, y):
            loss = xent(model(x), y)
            cstorch.backward(loss)
            optimizer.step()
            return loss

        rng = np.random.default_rng(0)
        data = [(rng.normal(size=(16, 8)).astype(np.float32),
                 rng.integers(0, 4, 16).astype(np.int32)) for _ in range(5)]
        losses = np.array([float(step(x, y)) for x, y in data])
        return losses, model.state_dict()

    ref_losses, ref_state = train(None)
    losses, state = train(WS8)
    assert rel_err(losses, ref_losses) <= 1e-5
    for name in ("1.running_mean", "1.running_var"):
        assert rel_err(state[name], ref_state[name]) <= 1e-5, name


@pytest.mark.skipif("sharded" not in cstorch.wse.EXECUTION_MODES,
                    reason="ClusterConfig(execution_mode='sharded') is not accepted yet")
def test_sharded_mode_keeps_the_spmd_layout():
    """``execution_mode="sharded"``: state split over "wgt" as in weight streaming, one
    global-view call placed by XLA's SPMD partitioner, batch over "csx" only."""
    ref_losses, ref_state, _, _ = _train(None, steps=4)
    losses, state, step, backend = _train(dict(WS8, execution_mode="sharded"), steps=4)
    assert backend.wafer.mode == "sharded" and backend.wafer.size == 8
    assert rel_err(losses, ref_losses) <= 1e-5
    assert all("wgt" in p._value.sharding.spec for p in step._diff_refs)
    x, y = _batches(1)[0]
    report = cstorch.wse.collective_report(step, x, y)
    assert not [loop for loop in report.loops if loop.count("all-gather")]


def test_dropout_draws_differently_on_each_device():
    """Random ops get ``fold_in(key, device)``: equal rows on different devices get
    different dropout masks (one key for all would give equal outputs)."""
    torch = pytest.importorskip("torch")
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), *[nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
                                          for _ in range(3)])
    model = cstorch.compile(net, fresh_backend(WS8))
    x = np.ones((8, 8), np.float32)  # one row per device, all equal
    out = np.asarray(model(x))
    assert np.isfinite(out).all()
    assert len({row.tobytes() for row in out}) == 8
    model.eval()
    assert len({row.tobytes() for row in np.asarray(model(x))}) == 1
