"""The emulated wafer: replica and weight-streaming layouts on 8 CPU devices.

Every layout must train exactly like the single-device CPU backend (fp32, 20 steps).
Run in its own process:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/multidevice
"""

from __future__ import annotations

import pathlib
import sys

import jax
import numpy as np
import pytest
from helpers import (
    batches,
    fresh_backend,
    mlp_apply,
    mlp_params,
    per_system_input_fn,
    rel_err,
    xent,
    xent_step,
)

import cerebrax as cstorch

STEPS = 20
ClusterConfig = cstorch.distributed.ClusterConfig

LAYOUTS = {
    "replica8": dict(execution_mode="replica", num_replicas=8),
    "replica2x4": dict(execution_mode="replica", num_csx=2, num_replicas=4),
    "ws8": dict(execution_mode="weight_streaming", max_wgt_servers=8),
    "ws2x4": dict(execution_mode="weight_streaming", num_csx=2, max_wgt_servers=4),
}
# The same layouts processing each system's rows in micro-batches (batches of 32 rows).
MICRO_LAYOUTS = {
    "ws8_micro8": dict(LAYOUTS["ws8"], micro_batch_size=8),
    "ws2x4_micro4": dict(LAYOUTS["ws2x4"], micro_batch_size=4),
    "replica8_micro8": dict(LAYOUTS["replica8"], micro_batch_size=8),
    "replica2x4_micro8": dict(LAYOUTS["replica2x4"], micro_batch_size=8),
}
LAYOUTS.update(MICRO_LAYOUTS)


def _cnn(seed: int = 0):
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            # No conv bias: before BatchNorm its gradient is 0, its value rounding noise.
            self.conv = nnx.Conv(3, 8, kernel_size=(3, 3), use_bias=False, rngs=rngs)
            self.bn = nnx.BatchNorm(8, momentum=0.9, rngs=rngs)
            self.fc = nnx.Linear(8, 4, rngs=rngs)

        def __call__(self, x):
            h = jax.nn.relu(self.bn(self.conv(x)))
            return self.fc(h.mean(axis=(1, 2)))

    return Net(nnx.Rngs(seed))


def _data(model_kind: str, n: int = STEPS):
    if model_kind == "mlp":
        return batches(n)
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(n, 32, 6, 6, 3)).astype(np.float32)
    ys = rng.integers(0, 4, size=(n, 32)).astype(np.int32)
    return list(zip(xs, ys))


def _optimizer(kind: str, params):
    if kind == "sgd":
        return cstorch.optim.SGD(params, lr=0.1, momentum=0.9)
    return cstorch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)


def _train(layout: str | None, model_kind: str, opt_kind: str, steps: int = STEPS):
    """Trains from the same initial state; returns losses, final state and the step."""
    backend = fresh_backend(LAYOUTS.get(layout))
    if model_kind == "mlp":
        module = cstorch.FunctionalModel(mlp_apply, mlp_params(0))
    else:
        module = _cnn(0)
    model = cstorch.compile(module, backend)
    optimizer = _optimizer(opt_kind, model.parameters())

    training_step = xent_step(model, optimizer)

    loader = cstorch.utils.data.DataLoader(per_system_input_fn(_data(model_kind, steps)),
                                           num_steps=steps)
    losses = [training_step(x, y)
              for x, y in cstorch.utils.data.DataExecutor(loader, progress_bar=False)]
    return np.array([float(v) for v in losses]), model.state_dict(), training_step, backend


@pytest.fixture(autouse=True)
def _clean():
    yield
    cstorch.reset()


@pytest.mark.parametrize("opt_kind", ["sgd", "adamw"])
@pytest.mark.parametrize("model_kind", ["mlp", "cnn"])
@pytest.mark.parametrize("layout", [k for k in LAYOUTS if k not in MICRO_LAYOUTS])
def test_layout_trains_like_one_device(layout, model_kind, opt_kind):
    ref_losses, ref_state, _, _ = _train(None, model_kind, opt_kind)
    losses, state, step, backend = _train(layout, model_kind, opt_kind)
    wafer = backend.wafer
    assert wafer is not None and wafer.size == 8
    assert rel_err(losses, ref_losses) <= 1e-5, (losses, ref_losses)
    assert set(state) == set(ref_state)
    for name in ref_state:
        assert rel_err(state[name], ref_state[name]) <= 1e-5, name
    # The state lives on the whole mesh, laid out as the mode says.
    specs = [p._value.sharding.spec for p in step._diff_refs]
    for p in step._diff_refs:
        assert len(p._value.sharding.device_set) == 8
    if wafer.mode == "replica":
        assert all(all(a is None for a in spec) for spec in specs)
    else:
        assert any("wgt" in spec for spec in specs)


def _train_torch_gpt(layout: str | None, steps: int = STEPS):
    """A GPT-style torch model (tied head) through the bridge, trained with AdamW."""
    torch = pytest.importorskip("torch")

    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "torch_bridge"))
    from bridge_zoo import GPT

    backend = fresh_backend(LAYOUTS.get(layout))
    torch.manual_seed(0)
    model = cstorch.compile(GPT(vocab=48, block=16, d=32, heads=4, layers=2), backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)

    training_step = xent_step(model, optimizer, lambda logits, targets: xent(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)))

    rng = np.random.default_rng(2)
    data = [(rng.integers(0, 48, (8, 16)).astype(np.int32),
             rng.integers(0, 48, (8, 16)).astype(np.int32)) for _ in range(steps)]
    losses = [float(training_step(x, y)) for x, y in data]
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    return np.array(losses), state, training_step


@pytest.mark.parametrize("layout", [k for k in LAYOUTS if k not in MICRO_LAYOUTS])
def test_torch_gpt_trains_like_one_device(layout):
    ref_losses, ref_state, _ = _train_torch_gpt(None)
    losses, state, step = _train_torch_gpt(layout)
    assert rel_err(losses, ref_losses) <= 1e-5, (losses, ref_losses)
    assert set(state) == set(ref_state)
    for name in ref_state:
        a, b = state[name], ref_state[name]
        if name.endswith("attn.qkv.bias"):
            # The key bias adds the same score to every key: softmax cancels it, its
            # gradient is rounding noise, and Adam scales noise up to full-size steps.
            a, b = np.delete(a, np.s_[32:64]), np.delete(b, np.s_[32:64])
        assert rel_err(a, b) <= 1e-5, name
    assert all(len(p._value.sharding.device_set) == 8 for p in step._diff_refs)
    if LAYOUTS[layout]["execution_mode"] == "weight_streaming":
        assert any("wgt" in p._value.sharding.spec for p in step._diff_refs)


@pytest.mark.parametrize("layout", list(MICRO_LAYOUTS))
def test_micro_batched_layout_trains_like_one_device(layout):
    """Micro-batches add up to the whole batch's gradient: an MLP (no coupling between
    rows) trains exactly like one device that takes the whole batch at once."""
    ref_losses, ref_state, _, _ = _train(None, "mlp", "adamw")
    losses, state, step, backend = _train(layout, "mlp", "adamw")
    assert backend.wafer is not None and backend.wafer.size == 8
    assert rel_err(losses, ref_losses) <= 1e-5, (losses, ref_losses)
    for name in ref_state:
        assert rel_err(state[name], ref_state[name]) <= 1e-5, name
    x, y = batches(1)[0]
    assert "while" in step.lower(x, y).as_text()  # the micro-batch loop is in the program


def test_micro_batch_size_must_split_over_the_replicas():
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(
        execution_mode="replica", num_replicas=8, micro_batch_size=4))
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)), backend)
    step = xent_step(model, cstorch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(cstorch.ConfigError, match="multiple of num_replicas. Fix: set "
                                                   "micro_batch_size to 8"):
        step(*batches(1)[0])


def test_weight_streaming_shards_weights_and_optimizer_state():
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(max_wgt_servers=8))
    sizes = (32, 512, 256, 8)
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0, sizes)), backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3)

    training_step = xent_step(model, optimizer)

    x = np.zeros((16, 32), np.float32)
    y = np.zeros((16,), np.int32)
    report = cstorch.wse.memory_report(training_step, x, y)
    assert report.num_devices == 8 and report.mode == "weight_streaming"
    total = report.params_total_bytes + report.optimizer_total_bytes
    per_device = report.weight_and_optimizer_bytes
    bound = (total / 8 + report.largest_param_bytes) * 1.1
    assert per_device <= bound, report.format()
    assert per_device < total / 4, report.format()
    # XLA's memory analysis of the per-device program agrees: its arguments are the
    # state shards plus the batch (split over "csx" only: here one system, whole).
    state = per_device + report.other_state_bytes
    assert report.xla_argument_bytes == state + x.nbytes + y.nbytes, report.format()
    assert report.temp_bytes is not None
    assert "optimizer state" in report.format()
    float(training_step(x, y))  # still runs after the report


def test_replica_memory_report_holds_full_copies():
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(
        execution_mode="replica", num_replicas=8))
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)), backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    training_step = xent_step(model, optimizer)

    x, y = batches(1)[0]
    report = cstorch.wse.memory_report(training_step, x, y)
    assert report.params_bytes == report.params_total_bytes > 0
    assert report.optimizer_bytes == report.optimizer_total_bytes > 0


# ---- misconfigurations ----------------------------------------------------------------
@pytest.mark.parametrize("fields, words", [
    (dict(execution_mode="replica", num_csx=2, num_replicas=8), ["2 x 8 = 16", "8", "Fix"]),
    (dict(execution_mode="replica", num_replicas=9), ["9", "lower num_replicas to 8"]),
    (dict(max_wgt_servers=16), ["16 devices", "lower max_wgt_servers to 8"]),
    (dict(num_csx=3, max_wgt_servers=4), ["3 x 4 = 12", "max_wgt_servers to 2"]),
])
def test_too_many_devices_is_a_config_error(fields, words):
    with pytest.raises(cstorch.ConfigError) as info:
        cstorch.backend("CSX", cluster_config=ClusterConfig(**fields))
    for word in words:
        assert word in str(info.value), str(info.value)


def test_num_stages_in_replica_mode_is_a_config_error():
    with pytest.raises(cstorch.ConfigError, match="num_stages"):
        ClusterConfig(execution_mode="replica", num_replicas=8, num_stages=2)


def test_batch_not_divisible_by_data_parallel_size():
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(
        execution_mode="replica", num_csx=2, num_replicas=4))
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)), backend)

    @cstorch.trace
    def forward(x):
        return model(x).sum()

    with pytest.raises(cstorch.ConfigError) as info:
        forward(np.zeros((12, 8), np.float32))
    message = str(info.value)
    assert "`x`" in message and "12 rows" in message and "divisible by 8" in message


def test_default_cluster_config_stays_on_one_device():
    backend = cstorch.backend("CSX")
    assert backend.wafer is None and backend.layout is None
    assert backend.device == jax.devices()[0]


def test_loader_batch_not_divisible_is_a_config_error():
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(
        execution_mode="replica", num_replicas=8))
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)), backend)

    @cstorch.trace
    def forward(x):
        return model(x).sum()

    data = [np.zeros((12, 8), np.float32)] * 2
    loader = cstorch.utils.data.DataLoader(lambda: data, num_steps=2)
    with pytest.raises(cstorch.ConfigError, match="divisible by 8"):
        for x in cstorch.utils.data.DataExecutor(loader, progress_bar=False):
            forward(x)


def test_compile_only_writes_the_per_device_memory_report(tmp_path):
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend("CSX", compile_only=True, compile_dir=str(tmp_path),
                              cluster_config=ClusterConfig(max_wgt_servers=8))
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)), backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    training_step = xent_step(model, optimizer)

    x, y = batches(1)[0]
    training_step(x, y)
    text = (tmp_path / "training_step.memory.txt").read_text()
    assert "temp_size_in_bytes" in text
    assert "memory per device (8 device(s), mode weight_streaming)" in text


def _resumable_run(layout, data, load=None, save=None):
    backend = fresh_backend(LAYOUTS.get(layout))
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)), backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2)
    if load is not None:
        state = cstorch.load(load)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    training_step = xent_step(model, optimizer)

    losses = [float(training_step(x, y)) for x, y in data]
    if save is not None:
        cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, save)
    return losses


@pytest.mark.parametrize("layout", ["ws8", "replica2x4"])
def test_checkpoint_of_sharded_state_resumes(layout, tmp_path):
    data = batches(8)
    reference = _resumable_run(None, data)
    path = str(tmp_path / "half.mdl")
    first = _resumable_run(layout, data[:4], save=path)
    second = _resumable_run(layout, data[4:], load=path)
    assert rel_err(first + second, reference) <= 1e-5
