"""Pipeline mode: the model's layers split into stages, a GPipe schedule on 8 CPU devices.

Every pipelined run must train like the single-device CPU backend (fp32, 20 steps,
losses and final parameters within rel 1e-5). Models: an MLP given as
``FunctionalModel(layers=...)``, a GPT-style torch model through the bridge (embedding,
causal attention with a mask carried between stages next to the residual stream,
layer norm, MLP blocks, a head tied to the embedding), and an ``nnx.Sequential`` CNN
with BatchNorm.

BatchNorm normalizes per micro-batch in a pipeline. With one micro-batch per system
(``micro_batch_size`` = the per-system batch) and one system the run is the plain
single-device run. With several micro-batches the reference is the single-device step
that calls the model on the micro-batches one after the other (``model(chunk)`` for
each, outputs concatenated): the same normalization and the same running-statistics
updates, in the same order. With ``num_csx`` systems every system does that on its
own rows and the running statistics are averaged over systems at the end of the step.

Run in its own process:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/multidevice
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpt_model import gpt
from helpers import (
    batches,
    fresh_backend,
    mlp_apply,
    mlp_params,
    per_system_input_fn,
    rel_err,
    xent,
)

import cerebrax as cstorch

STEPS = 20
ClusterConfig = cstorch.distributed.ClusterConfig
MLP_SIZES = (8, 16, 16, 16, 4)  # four layers

LAYOUTS = {
    "pipe4": dict(execution_mode="pipeline", num_stages=4, micro_batch_size=8),
    "pipe2x4": dict(execution_mode="pipeline", num_csx=2, num_stages=4, micro_batch_size=4),
    # one micro-batch per system: BatchNorm sees the whole batch, as on one device
    "pipe4_whole": dict(execution_mode="pipeline", num_stages=4, micro_batch_size=32),
}


# ---- models ---------------------------------------------------------------------------
def _dense(p, x):
    return jnp.tanh(x @ p["weight"] + p["bias"])


def _linear(p, x):
    return x @ p["weight"] + p["bias"]


def _layered_mlp(seed: int = 0) -> cstorch.FunctionalModel:
    """The helpers' MLP (same names, same math) as a list of layers."""
    params = mlp_params(seed, MLP_SIZES)
    n = len(params)
    return cstorch.FunctionalModel(layers={
        f"fc{i + 1}": (_dense if i < n - 1 else _linear, params[f"fc{i + 1}"])
        for i in range(n)
    })


def _pool(h):
    return h.mean(axis=(1, 2))


def _cnn(seed: int = 0):
    from flax import nnx

    rngs = nnx.Rngs(seed)
    # No conv bias: before BatchNorm its gradient is 0, its value rounding noise.
    return nnx.Sequential(
        nnx.Conv(3, 8, kernel_size=(3, 3), use_bias=False, rngs=rngs),
        nnx.BatchNorm(8, momentum=0.9, rngs=rngs),
        jax.nn.gelu,  # smooth: rounding differences cannot flip a kink (ReLU at 0)
        _pool,
        nnx.Linear(8, 4, rngs=rngs),
    )


VOCAB, BLOCK, WIDTH, HEADS = 32, 8, 16, 2


def _gpt(seed: int = 0, layers: int = 3, gates: bool = False):
    return gpt(layers, vocab=VOCAB, seq=BLOCK, width=WIDTH, heads=HEADS, seed=seed,
               gates=gates)


def _model(kind: str, pipelined: bool):
    if kind == "mlp":
        if pipelined:
            return _layered_mlp(0)
        return cstorch.FunctionalModel(mlp_apply, mlp_params(0, MLP_SIZES))
    if kind.startswith("gpt"):
        return _gpt(0, gates=kind == "gpt_gates")
    return _cnn(0)


def _data(kind: str, n: int = STEPS, rows: slice = slice(None)):
    rng = np.random.default_rng(1)
    if kind == "mlp":
        xs = np.stack([x for x, _ in batches(n)])
        ys = np.stack([y for _, y in batches(n)])
    elif kind.startswith("gpt"):
        xs = rng.integers(0, VOCAB, size=(n, 32, BLOCK)).astype(np.int32)
        ys = rng.integers(0, VOCAB, size=(n, 32, BLOCK)).astype(np.int32)
    else:
        xs = rng.normal(size=(n, 32, 6, 6, 3)).astype(np.float32)
        ys = rng.integers(0, 4, size=(n, 32)).astype(np.int32)
    return list(zip(xs[:, rows], ys[:, rows]))


def _loss(logits, y):
    return xent(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _train(layout: str | None, kind: str, opt_kind: str, *, chunks: int = 1,
           steps: int = STEPS, rows: slice = slice(None)):
    """Trains from the same initial state; returns losses, final state, step, backend.

    ``chunks > 1`` (single device only): the step calls the model on ``chunks``
    consecutive slices of the batch, one after the other: the pipeline's reference.
    """
    backend = fresh_backend(LAYOUTS.get(layout))
    model = cstorch.compile(_model(kind, layout is not None), backend)
    if opt_kind == "sgd":
        optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)

    @cstorch.trace
    def training_step(x, y):
        if chunks == 1:
            logits = model(x)
        else:
            logits = jnp.concatenate([model(part) for part in jnp.split(x, chunks)])
        loss = _loss(logits, y)
        cstorch.backward(loss)
        optimizer.step()
        return loss

    loader = cstorch.utils.data.DataLoader(per_system_input_fn(_data(kind, steps, rows)),
                                           num_steps=steps)
    losses = [training_step(x, y)
              for x, y in cstorch.utils.data.DataExecutor(loader, progress_bar=False)]
    return np.array([float(v) for v in losses]), model.state_dict(), training_step, backend


@functools.cache
def _reference(kind: str, opt_kind: str, chunks: int = 1):
    losses, state, _, _ = _train(None, kind, opt_kind, chunks=chunks)
    return losses, state


_COLLECTIVE = re.compile(
    r"\b(all-reduce|all-to-all|all-gather|reduce-scatter|collective-permute)(?:-start)?\(")


def _collectives_in_branches(hlo: str) -> set[str]:
    """The collective ops that a compiled program's conditional branches (and the
    computations they call) contain, from its HLO text."""
    bodies, name = {}, None
    for line in hlo.splitlines():
        header = re.match(r"(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header:
            name = header.group(1)
            bodies[name] = []
        elif name is not None:
            bodies[name].append(line)
    text = {k: "\n".join(v) for k, v in bodies.items()}
    todo = [b.strip().lstrip("%") for body in text.values()
            for group in re.findall(r"branch_computations=\{([^}]*)\}", body)
            for b in group.split(",")]
    todo += [c for body in text.values()
             for c in re.findall(r"(?:true|false)_computation=%?([\w.\-]+)", body)]
    assert todo, "no conditional in the program: the check would check nothing"
    seen, found = set(), set()
    while todo:
        computation = todo.pop()
        if computation in seen or computation not in text:
            continue
        seen.add(computation)
        found.update(_COLLECTIVE.findall(text[computation]))
        todo.extend(re.findall(r"%([\w.\-]+)", text[computation]))
    return found


def _assert_same(losses, state, ref_losses, ref_state, *, skip=()):
    assert rel_err(losses, ref_losses) <= 1e-5, (losses, ref_losses)
    assert set(state) == set(ref_state)
    for name in ref_state:
        if name not in skip:
            assert rel_err(state[name], ref_state[name]) <= 1e-5, (
                name, rel_err(state[name], ref_state[name]))


@pytest.fixture(autouse=True)
def _clean():
    yield
    cstorch.reset()


# ---- training equals one device -------------------------------------------------------
@pytest.mark.parametrize("kind, opt_kind, layout", [
    ("mlp", "sgd", "pipe4"),
    ("mlp", "adamw", "pipe2x4"),
    ("gpt", "adamw", "pipe4"),
    ("gpt", "adamw", "pipe2x4"),
    # 0-dim parameters: stored whole on every stage device, not split
    ("gpt_gates", "adamw", "pipe4"),
    ("gpt_gates", "adamw", "pipe2x4"),
    ("cnn", "sgd", "pipe4_whole"),
])
def test_pipeline_trains_like_one_device(kind, opt_kind, layout):
    ref_losses, ref_state = _reference(kind, opt_kind)
    losses, state, step, backend = _train(layout, kind, opt_kind)
    _assert_same(losses, state, ref_losses, ref_state)
    wafer = backend.wafer
    assert wafer is not None and wafer.mode == "pipeline"
    assert wafer.mesh.axis_names == ("csx", "stage") and wafer.mesh.shape["stage"] == 4
    for p in step._diff_refs:
        assert len(p._value.sharding.device_set) == wafer.size
    if kind != "cnn":  # one compile more per test: only where it adds something
        hlo = step.lower(*_data(kind, 1)[0]).compile().as_text()
        assert "collective-permute" in hlo  # activations move between stage devices
        # Devices take different branches of the schedule's switches: a collective in
        # a branch waits forever for the devices that took another (XLA aborts).
        assert _collectives_in_branches(hlo) == set()


def test_batchnorm_with_micro_batches_equals_calls_one_after_the_other():
    """4 micro-batches: the reference calls the model on the 4 slices in order."""
    ref_losses, ref_state = _reference("cnn", "sgd", chunks=4)
    losses, state, _, _ = _train("pipe4", "cnn", "sgd")
    _assert_same(losses, state, ref_losses, ref_state)
    # The plain one-device run normalizes over the whole batch: not the same.
    plain_losses, _ = _reference("cnn", "sgd")
    assert rel_err(losses, plain_losses) > 1e-4


def test_batchnorm_over_systems_averages_running_statistics():
    """num_csx=2 x 4 stages, 4 micro-batches per system.

    Outputs, losses and parameters: as calling the model on the 8 slices in order (each
    slice is normalized by its own statistics). Running statistics: after one step,
    the mean over the two systems of what each system's own 4 slices give in order.
    """
    ref_losses, ref_state = _reference("cnn", "sgd", chunks=8)
    losses, state, _, _ = _train("pipe2x4", "cnn", "sgd")
    stats = {"layers.1.mean", "layers.1.var"}
    _assert_same(losses, state, ref_losses, ref_state, skip=stats)

    _, one_step, _, _ = _train("pipe2x4", "cnn", "sgd", steps=1)
    halves = [_train(None, "cnn", "sgd", chunks=4, steps=1, rows=rows)[1]
              for rows in (slice(0, 16), slice(16, 32))]
    for name in stats:
        expected = (halves[0][name] + halves[1][name]) / 2
        assert rel_err(one_step[name], expected) <= 1e-5, name
        assert rel_err(one_step[name], halves[0][name]) > 1e-4, name


# ---- where the stages run -------------------------------------------------------------
def test_stages_run_in_order_on_their_own_devices():
    """Each stage stamps the stage and system index of the device that runs it."""
    cstorch.reset()
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(
        execution_mode="pipeline", num_csx=2, num_stages=4, micro_batch_size=2))
    wafer = backend.wafer

    def stamp(p, x):
        s = jax.lax.axis_index("stage").astype(jnp.float32)
        c = jax.lax.axis_index("csx").astype(jnp.float32)
        return x * 10 + (s + 1) + 1000 * c + 0 * p["w"]

    model = cstorch.FunctionalModel(
        layers=[(stamp, {"w": jnp.zeros(())}) for _ in range(4)])
    layers = cstorch.compile(model, backend)._adapter.pipeline_layers(
        {}, {}, (), {}, train=True)
    assert list(layers.names) == ["0", "1", "2", "3"]

    params = {f"{i}.w": jnp.zeros(()) for i in range(4)}
    x = jnp.zeros((8, 1))
    out, _ = jax.jit(lambda p, x: cstorch.wse.pipelined_apply(
        lambda a, kw: layers, wafer, 2, p, {}, (x,), {}))(params, x)
    # Rows 0-3 ran on system 0, rows 4-7 on system 1; stage s on stage device s.
    per_system = [1234 + 1000 * c * 1111 for c in (0, 1)]
    np.testing.assert_array_equal(np.asarray(out)[:, 0], np.repeat(per_system, 4))


def test_split_layers_balances_contiguous_stages():
    split = cstorch.wse.split_layers
    assert split([1, 1, 1, 1], 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert split([8, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 9)]
    assert split([3, 3, 3, 3, 3, 3], 3) == [(0, 2), (2, 4), (4, 6)]


def test_gpt_layers_are_child_modules_and_tied_weight_is_in_two_stages():
    cstorch.reset()
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(**LAYOUTS["pipe4"]))
    model = cstorch.compile(_gpt(0), backend)
    example = jax.ShapeDtypeStruct((8, BLOCK), jnp.int32)
    layers = model._adapter.pipeline_layers({}, {}, (example,), {}, train=True)
    names = list(layers.names)
    assert {"wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "ln_f", "head"} <= set(names)
    ranges = cstorch.wse.split_layers(layers.costs, 4)
    stages = [layers.stage(lo, hi) for lo, hi in ranges]
    # Blocks are never cut; the tied weight is read by the first and the last stage.
    for lo, hi in ranges:
        assert all(n == "<root>" or names.count(n) == 1 for n in names[lo:hi])
    assert "wte.weight" in stages[0].params and "wte.weight" in stages[-1].params


def test_default_micro_batches_are_one_per_stage():
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(
        execution_mode="pipeline", num_stages=4))
    assert backend.wafer.micro_batch_size is None
    model = cstorch.compile(_layered_mlp(0), backend)
    x, _ = batches(1)[0]
    expected = mlp_apply(mlp_params(0, MLP_SIZES), x)
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(expected), rtol=1e-5,
                               atol=1e-6)


# ---- misconfigurations ----------------------------------------------------------------
def _forward_error(fields: dict, model, x) -> str:
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(**fields))
    compiled = cstorch.compile(model, backend)

    @cstorch.trace
    def forward(x):
        return compiled(x).sum()

    with pytest.raises(cstorch.ConfigError) as info:
        forward(x)
    return str(info.value)


def test_more_stages_than_layers():
    message = _forward_error(dict(execution_mode="pipeline", num_stages=5, micro_batch_size=8),
                             _layered_mlp(0), np.zeros((32, 8), np.float32))
    assert "num_stages=5" in message and "layers (4: fc1, fc2, fc3, fc4)" in message
    assert "at most 4" in message


def test_per_system_batch_not_divisible_by_micro_batch():
    message = _forward_error(
        dict(execution_mode="pipeline", num_csx=2, num_stages=4, micro_batch_size=5),
        _layered_mlp(0), np.zeros((32, 8), np.float32))
    assert "micro_batch_size=5" in message and "16 rows" in message
    assert "num_csx x micro_batch_size = 10" in message and "[1, 2, 4, 8, 16]" in message


def test_default_micro_batches_need_a_batch_divisible_by_stages():
    message = _forward_error(dict(execution_mode="pipeline", num_stages=4),
                             _layered_mlp(0), np.zeros((6, 8), np.float32))
    assert "6 rows" in message and "num_stages=4" in message and "micro_batch_size" in message


def test_batch_not_divisible_by_systems():
    cstorch.reset()
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(
        execution_mode="pipeline", num_csx=2, num_stages=4, micro_batch_size=4))
    model = cstorch.compile(_layered_mlp(0), backend)

    @cstorch.trace
    def forward(x):
        return model(x[:15]).sum()  # the model sees 15 rows

    with pytest.raises(cstorch.ConfigError, match="15 rows cannot be split over num_csx=2"):
        forward(np.zeros((32, 8), np.float32))


@pytest.mark.parametrize("fields, words", [
    (dict(num_stages=9), ["num_stages=9", "9 devices", "lower num_stages to 8"]),
    (dict(num_csx=3, num_stages=4), ["3 x 4 = 12", "lower num_stages to 2"]),
])
def test_more_stages_than_devices(fields, words):
    with pytest.raises(cstorch.ConfigError) as info:
        cstorch.backend("CSX", cluster_config=ClusterConfig(execution_mode="pipeline",
                                                            **fields))
    for word in words:
        assert word in str(info.value), str(info.value)


def test_model_without_layers():
    message = _forward_error(dict(execution_mode="pipeline", num_stages=2),
                             cstorch.FunctionalModel(mlp_apply, mlp_params(0)),
                             np.zeros((32, 8), np.float32))
    assert "FunctionalModel gives no layers" in message and "layers=" in message


def test_nnx_module_without_layer_list():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc = nnx.Linear(8, 4, rngs=rngs)

        def __call__(self, x):
            return self.fc(x)

    message = _forward_error(dict(execution_mode="pipeline", num_stages=2),
                             Net(nnx.Rngs(0)), np.zeros((32, 8), np.float32))
    assert "nnx.Sequential" in message and "Net has no `layers` list" in message


def test_output_without_batch_dimension():
    model = cstorch.FunctionalModel(layers=[
        (_dense, mlp_params(0)["fc1"]), (lambda p, h: h.sum(), None)])
    message = _forward_error(dict(execution_mode="pipeline", num_stages=2), model,
                             np.zeros((32, 8), np.float32))
    assert "batch as its first dimension" in message and "shape ()" in message


def test_layers_and_apply_fn_together():
    with pytest.raises(cstorch.ConfigError, match="either apply_fn and params, or layers="):
        cstorch.FunctionalModel(mlp_apply, mlp_params(0), layers=[(mlp_apply, {})])


def test_layered_functional_model_on_one_device_is_the_composition():
    model = cstorch.compile(_layered_mlp(0), "CPU")
    x, _ = batches(1)[0]
    assert [n for n, _ in model.named_parameters()] == [
        f"fc{i}.{w}" for i in range(1, 5) for w in ("bias", "weight")]
    expected = mlp_apply(mlp_params(0, MLP_SIZES), x)
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(expected), rtol=1e-6)


@pytest.mark.parametrize("kind", ["gpt", "gpt_gates"])
def test_mixed_precision_pipeline_trains_like_one_device(kind):
    """float16 compute (the CSX default): carries and parameters packed per dtype; with
    gates, a 0-dim float32 parameter times a float16 activation in a stage."""
    losses = {}
    for layout in (None, "pipe4"):
        cstorch.reset()
        cluster = ClusterConfig(**LAYOUTS[layout]) if layout else None
        backend = cstorch.backend("CSX", cluster_config=cluster)
        model = cstorch.compile(_model(kind, layout is not None), backend)
        optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2)

        @cstorch.trace
        def training_step(x, y):
            loss = _loss(model(x), y)
            cstorch.backward(loss)
            optimizer.step()
            return loss

        losses[layout] = [float(training_step(x, y)) for x, y in _data(kind, 3)]
    assert rel_err(losses["pipe4"], losses[None]) <= 1e-3, losses
