"""The traced step: one program, compile once, deferred backward, errors, closures."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    batches,
    compiled_mlp,
    flat_params,
    max_rel_tree,
    mlp_apply,
    mlp_params,
    xent,
    xent_step,
)

import cerebrax as cstorch


def _reference(tx: optax.GradientTransformation, data, steps: int = 20):
    """A hand-written jax.value_and_grad + optax loop: the reference for traced steps."""

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(lambda p: xent(mlp_apply(p, x), y))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    # mlp_params' biases are weakly typed (jnp.full of a Python float); the step returns
    # them strongly typed, which would trace the step a second time.
    params = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), mlp_params())
    state = tx.init(params)
    losses = []
    for x, y in data[:steps]:
        params, state, loss = step(params, state, x, y)
        losses.append(float(loss))
    return np.array(losses), flat_params(params)


def _train(make_optimizer, make_scheduler=None, steps: int = 20):
    model = compiled_mlp()
    optimizer = make_optimizer(model.parameters())
    scheduler = make_scheduler(optimizer) if make_scheduler else None

    @cstorch.trace
    def training_step(x, y):
        loss = xent(model(x), y)
        cstorch.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        return loss

    losses = [float(training_step(x, y)) for x, y in batches()[:steps]]
    return np.array(losses), model.state_dict(), training_step


def test_sgd_step_equals_hand_written_loop():
    losses, params, step = _train(lambda p: cstorch.optim.SGD(p, lr=0.1, momentum=0.9))
    ref_losses, ref_params = _reference(cstorch.optim.transforms.sgd(0.1, momentum=0.9), batches())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    assert max_rel_tree(params, ref_params) <= 1e-6
    assert step.num_compiles == 1  # one program for the 20 steps, like the jitted loop


def test_adamw_with_linear_lr_equals_hand_written_loop():
    losses, params, step = _train(
        lambda p: cstorch.optim.AdamW(p, lr=0.01, weight_decay=0.05, eps=1e-8),
        lambda opt: cstorch.optim.lr_scheduler.LinearLR(opt, 0.01, 0.001, total_iters=10),
    )
    schedule = optax.schedules.linear_schedule(0.01, 0.001, transition_steps=10)
    tx = cstorch.optim.transforms.adamw(schedule, weight_decay=0.05)
    ref_losses, ref_params = _reference(tx, batches())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    assert max_rel_tree(params, ref_params) <= 1e-6
    assert step.num_compiles == 1  # the scheduler steps inside the one program


def test_second_call_compiles_nothing(compiles):
    model = compiled_mlp()
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = cstorch.optim.lr_scheduler.CosineDecayLR(optimizer, 1e-3, 0.0, 10)

    @cstorch.trace
    def training_step(x, y):
        loss = xent(model(x), y)
        cstorch.amp.optimizer_step(loss, optimizer, max_gradient_norm=1.0)
        scheduler.step()
        return loss

    data = batches(5)
    training_step(*data[0])
    before = compiles.count
    for x, y in data[1:]:
        training_step(x, y)
    assert compiles.count == before
    optimizer.param_groups[0]["lr"] = 0.5  # a new learning rate is state, not graph
    before = compiles.count
    training_step(*data[0])
    assert compiles.count == before
    assert training_step.num_compiles == 1


def test_state_buffers_are_donated():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    training_step = xent_step(model, optimizer)

    (x, y), = batches(1)
    training_step(x, y)
    old = model.parameters()[0]._value
    training_step(x, y)
    assert old.is_deleted()


def test_new_batch_size_raises_recompile_error_naming_both_shapes():
    model = compiled_mlp()

    @cstorch.trace
    def eval_step(inputs, labels):
        return xent(model(inputs), labels)

    x, y = batches(1)[0]
    eval_step(x, y)
    with pytest.raises(cstorch.RecompileError) as info:
        eval_step(x[:16], y[:16])
    message = str(info.value)
    assert "`inputs`" in message
    assert "(32, 8)" in message and "(16, 8)" in message
    assert "drop_last=True" in message


def test_changed_python_argument_raises_recompile_error():
    model = compiled_mlp()

    @cstorch.trace
    def step(x, scale):
        return model(x).sum() * scale

    x = batches(1)[0][0]
    step(x, 2.0)
    with pytest.raises(cstorch.RecompileError, match="`scale` = 2.0"):
        step(x, 3.0)


def test_an_argument_that_turns_from_array_to_python_value_is_named_as_such():
    model = compiled_mlp()

    @cstorch.trace
    def step(x, scale):
        return model(x).sum() * scale

    x = batches(1)[0][0]
    step(x, jnp.float32(2.0))
    with pytest.raises(cstorch.RecompileError) as info:
        step(x, 3.0)
    message = str(info.value)
    assert "`scale` as an array" in message and "the Python value 3.0" in message


def test_allow_recompile_compiles_again():
    cstorch.backend("CPU", allow_recompile=True)
    model = compiled_mlp()

    @cstorch.trace
    def step(x):
        return model(x).sum()

    x = batches(1)[0][0]
    full = step(x)
    half = step(x[:16])
    assert step.num_compiles == 2
    np.testing.assert_allclose(full, mlp_apply(mlp_params(), x).sum(), rtol=1e-6)
    np.testing.assert_allclose(half, mlp_apply(mlp_params(), x[:16]).sum(), rtol=1e-6)


@pytest.mark.parametrize("read", [float, bool, lambda v: v.item(), np.asarray, int])
def test_reading_a_value_inside_the_step_raises(read):
    model = compiled_mlp()

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        read(loss)
        return loss

    with pytest.raises(cstorch.TensorReadError) as info:
        step(batches(1)[0][0])
    assert "step_closure" in str(info.value)
    assert "not allowed to read a tensor's contents outside of a step closure" in str(info.value)


def test_python_branch_on_a_tensor_raises():
    model = compiled_mlp()

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        if loss > 0:
            return loss
        return -loss

    with pytest.raises(cstorch.TensorReadError):
        step(batches(1)[0][0])


def test_python_counter_in_the_step_sees_its_first_value():
    model = compiled_mlp()
    calls = []

    @cstorch.trace
    def step(x):
        calls.append(1)
        return model(x).sum() * len(calls)

    x = batches(1)[0][0]
    outs = [float(step(x)) for _ in range(3)]
    assert len(calls) == 1
    assert outs[0] == outs[1] == outs[2]


def test_step_closures_run_in_order_with_the_step_values():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    seen = []

    @cstorch.step_closure
    def record(tag, value, step=None):
        seen.append((tag, np.asarray(value).copy(), step))

    @cstorch.trace
    def training_step(x, y):
        logits = model(x)
        loss = xent(logits, y)
        record("logits", logits[0, 0])
        cstorch.backward(loss)
        optimizer.step()
        record("loss", loss)
        return loss

    data = batches(4)
    ref = mlp_params()
    expected = []
    tx = cstorch.optim.transforms.sgd(0.1)
    state = tx.init(ref)
    for x, y in data:
        expected += [("logits", mlp_apply(ref, x)[0, 0]), ("loss", xent(mlp_apply(ref, x), y))]
        grads = jax.grad(lambda p: xent(mlp_apply(p, x), y))(ref)
        updates, state = tx.update(grads, state, ref)
        ref = optax.apply_updates(ref, updates)
    loader = cstorch.utils.data.DataLoader(lambda: data, num_steps=len(data))
    executor = cstorch.utils.data.DataExecutor(loader, progress_bar=False)
    for x, y in executor:
        loss = training_step(x, y)
        record("outside", loss, executor.iteration)
    tags = [t for t, _, _ in seen]
    assert tags == ["logits", "loss", "outside"] * 4
    inside = [(t, v) for t, v, _ in seen if t != "outside"]
    for (tag, got), (tag_ref, want) in zip(inside, expected):
        assert tag == tag_ref
        np.testing.assert_allclose(got, want, rtol=1e-5)
    outside = [(v, s) for t, v, s in seen if t == "outside"]
    assert [s for _, s in outside] == [0, 1, 2, 3]
    np.testing.assert_allclose([v for v, _ in outside], [v for t, v in inside if t == "loss"])
    assert all(isinstance(v, np.ndarray) for _, v, _ in seen)


def test_closures_run_one_step_behind_inside_an_executor():
    model = compiled_mlp()
    log = []

    @cstorch.step_closure
    def record(step):
        log.append(("closure", step))

    @cstorch.trace
    def step_fn(x):
        return model(x).sum()

    data = [x for x, _ in batches(5)]
    loader = cstorch.utils.data.DataLoader(lambda: data, num_steps=5)
    executor = cstorch.utils.data.DataExecutor(loader, checkpoint_steps=0, progress_bar=False)
    for x in executor:
        log.append(("dispatch", executor.iteration))
        step_fn(x)
        record(executor.iteration)
    # closure s runs after step s + 1 was dispatched; the final step drains the queue.
    assert log == [("dispatch", 0), ("dispatch", 1), ("closure", 0), ("dispatch", 2),
                   ("closure", 1), ("dispatch", 3), ("closure", 2), ("dispatch", 4),
                   ("closure", 3), ("closure", 4)]


def test_checkpoint_closure_runs_on_checkpoint_steps_and_the_last_only():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    saved = {}

    @cstorch.checkpoint_closure
    def save(step):
        saved[step] = model.state_dict()["fc1.bias"]

    @cstorch.checkpoint_closure
    def in_step_save(loss):
        saved.setdefault("in_step", []).append(float(loss))

    @cstorch.trace
    def training_step(x, y):
        loss = xent(model(x), y)
        cstorch.backward(loss)
        optimizer.step()
        in_step_save(loss)
        return loss

    data = batches(10)
    loader = cstorch.utils.data.DataLoader(lambda: data, num_steps=10)
    executor = cstorch.utils.data.DataExecutor(loader, checkpoint_steps=4, progress_bar=False)
    biases, losses = {}, []
    for x, y in executor:
        losses.append(training_step(x, y))
        save(executor.iteration)
        if executor.iteration in (3, 7, 9):
            biases[executor.iteration] = np.array(model.state_dict()["fc1.bias"])
    assert sorted(k for k in saved if k != "in_step") == [3, 7, 9]
    for step in (3, 7, 9):
        np.testing.assert_array_equal(saved[step], biases[step])
    np.testing.assert_allclose(saved["in_step"], [float(losses[i]) for i in (3, 7, 9)])


def test_checkpoint_closure_before_any_step_runs_at_once_and_later_outside_raises():
    """cstorch's pre-initial step: before any step ran, a checkpoint closure runs at once on
    the initial state (Model Zoo's save_initial_checkpoint, called before its executor
    exists). After a step, outside an executor, it raises."""
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    initial = np.array(model.state_dict()["fc1.bias"])
    saved = []

    @cstorch.checkpoint_closure
    def save():
        saved.append(np.array(model.state_dict()["fc1.bias"]))

    save()
    assert len(saved) == 1
    np.testing.assert_array_equal(saved[0], initial)

    @cstorch.trace
    def training_step(x, y):
        loss = xent(model(x), y)
        cstorch.backward(loss)
        optimizer.step()
        return loss

    training_step(*batches(1)[0])
    with pytest.raises(cstorch.StateError, match="Cannot fetch a checkpoint outside"):
        save()


def test_reading_state_in_a_late_step_closure_raises():
    model = compiled_mlp()

    @cstorch.step_closure
    def peek():
        model.state_dict()

    @cstorch.trace
    def step_fn(x):
        return model(x).sum()

    data = [x for x, _ in batches(3)]
    loader = cstorch.utils.data.DataLoader(lambda: data, num_steps=3)
    with pytest.raises(cstorch.StateError, match="checkpoint_closure"):
        for x in cstorch.utils.data.DataExecutor(loader, progress_bar=False):
            step_fn(x)
            peek()


def test_step_closure_outside_a_step_runs_immediately():
    seen = []

    @cstorch.step_closure
    def record(value):
        seen.append(value)

    record(jnp.float32(2.5))
    assert seen == [2.5] and isinstance(seen[0], np.ndarray)


def test_deferred_gradient_norm_reaches_a_closure():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    norms = []

    @cstorch.step_closure
    def record(norm):
        norms.append(float(norm))

    @cstorch.trace
    def training_step(x, y):
        loss = xent(model(x), y)
        cstorch.backward(loss)
        norm = cstorch.optim.clip_grad_norm_(model.parameters(), 0.5)
        record(norm)
        optimizer.step()
        return norm

    x, y = batches(1)[0]
    returned = training_step(x, y)
    grads = jax.grad(lambda p: xent(mlp_apply(p, x), y))(mlp_params())
    expected = float(optax.tree.norm(grads))
    np.testing.assert_allclose(norms, [expected], rtol=1e-5)
    np.testing.assert_allclose(returned, expected, rtol=1e-5)
    # The update used the clipped gradient: p - 0.1 * g * 0.5 / (|g| + 1e-6).
    clipped = jax.tree.map(lambda g: g * 0.5 / (expected + 1e-6), grads)
    want = flat_params(jax.tree.map(lambda p, g: p - 0.1 * g, mlp_params(), clipped))
    assert max_rel_tree(model.state_dict(), want) <= 1e-5


def test_scheduler_step_after_optimizer_step_applies_in_program_order():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = cstorch.optim.lr_scheduler.LinearLR(optimizer, 0.1, 0.0, total_iters=2)
    lrs = []

    @cstorch.step_closure
    def record(lr):
        lrs.append(float(lr))

    @cstorch.trace
    def training_step(x, y):
        loss = xent(model(x), y)
        cstorch.backward(loss)
        record(optimizer.param_groups[0]["lr"])  # read before the deferred calls run
        optimizer.step()
        scheduler.step()
        return loss

    for x, y in batches(3):
        training_step(x, y)
    assert scheduler.get_last_lr() == pytest.approx([0.0])
    # The lr read in the forward pass is the one the optimizer step of that step used.
    np.testing.assert_allclose(lrs, [0.1, 0.05, 0.0], rtol=1e-6)


def test_model_mode_is_part_of_the_graph():
    model = compiled_mlp()

    @cstorch.trace
    def step(x):
        return model(x).sum()

    x = batches(1)[0][0]
    step(x)
    model.eval()
    with pytest.raises(cstorch.RecompileError, match="eval mode"):
        step(x)


def test_train_and_eval_modes_reach_the_apply_function():
    def apply(params, x, *, train):
        return x * params["w"] * (2.0 if train else 1.0)

    model = cstorch.compile(cstorch.FunctionalModel(apply, {"w": jnp.ones(3)}), "CPU")

    @cstorch.trace
    def train_step(x):
        return model(x)

    @cstorch.trace
    def eval_step(x):
        return model(x)

    x = jnp.arange(3.0)
    np.testing.assert_allclose(train_step(x), 2 * x)
    model.eval()
    np.testing.assert_allclose(eval_step(x), x)
    np.testing.assert_allclose(model(x), x)


def test_buffers_update_through_the_step():
    def apply(params, buffers, x):
        count = buffers["count"] + 1
        mean = buffers["mean"] + (x.mean(0) - buffers["mean"]) / count
        return (x - mean) @ params["w"], {"count": count, "mean": mean}

    model = cstorch.compile(cstorch.FunctionalModel(
        apply, {"w": jnp.ones((2, 1))}, {"count": jnp.float32(0), "mean": jnp.zeros(2)}), "CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.0)

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        cstorch.backward(loss)
        optimizer.step()
        return loss

    xs = np.random.default_rng(0).normal(size=(3, 4, 2)).astype(np.float32)
    for x in xs:
        step(x)
    state = model.state_dict()
    assert float(state["count"]) == 3
    np.testing.assert_allclose(state["mean"], xs.mean(axis=(0, 1)), rtol=1e-5)


def test_random_key_changes_every_step():
    def apply(params, x, *, key):
        return x * params["w"] + jax.random.normal(key, x.shape)

    model = cstorch.compile(cstorch.FunctionalModel(apply, {"w": jnp.ones(4)}), "CPU")

    @cstorch.trace
    def step(x):
        return model(x)

    x = jnp.zeros(4)
    a, b = np.array(step(x)), np.array(step(x))
    assert not np.allclose(a, b)


def test_two_compiled_models_in_one_step_raise():
    first, second = compiled_mlp(seed=0), compiled_mlp(seed=1)

    @cstorch.trace
    def step(x):
        return first(x).sum() + second(x).sum()

    with pytest.raises(cstorch.StateError, match="more than one compiled model"):
        step(batches(1)[0][0])


def test_state_created_inside_a_step_raises():
    model = compiled_mlp()

    @cstorch.trace
    def step(x):
        metric = cstorch.metrics.AccuracyMetric("acc")
        metric(jnp.zeros(3), jnp.zeros(3))
        return model(x).sum()

    with pytest.raises(cstorch.StateError, match="created inside a traced step"):
        step(batches(1)[0][0])


def test_optimizer_step_without_backward_raises():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        optimizer.step()
        return loss

    with pytest.raises(cstorch.StateError, match="before the loss was marked"):
        step(batches(1)[0][0])


def test_backward_outside_a_step_raises():
    with pytest.raises(cstorch.StateError, match="@cstorch.trace"):
        cstorch.backward(jnp.float32(1.0))


def test_deferred_value_cannot_be_computed_with():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        loss = xent(model(x), y)
        cstorch.backward(loss)
        norm = cstorch.optim.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss + jnp.asarray(norm)

    with pytest.raises(cstorch.StateError, match="only known after the backward pass"):
        step(*batches(1)[0])


def test_validate_only_runs_nothing(capsys):
    cstorch.backend("CSX", validate_only=True)
    model = compiled_mlp(backend=None)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    before = model.state_dict()

    step = xent_step(model, optimizer)

    out = step(*batches(1)[0])
    assert isinstance(out, jax.ShapeDtypeStruct) and out.shape == ()
    assert "validated" in capsys.readouterr().out
    after = model.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_compile_only_writes_artifacts_and_runs_nothing(tmp_path):
    cstorch.backend("CSX", compile_only=True, compile_dir=str(tmp_path / "compile"))
    model = compiled_mlp(backend=None)
    before = model.state_dict()

    @cstorch.trace
    def step(x):
        return model(x).sum()

    out = step(batches(1)[0][0])
    assert isinstance(out, jax.ShapeDtypeStruct)
    hlo = (tmp_path / "compile" / "step.hlo.txt").read_text()
    assert "func" in hlo or "HloModule" in hlo
    memory = (tmp_path / "compile" / "step.memory.txt").read_text()
    assert "argument_size_in_bytes" in memory
    after = model.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "backend, half, expected",
    [("CPU", None, jnp.float32), ("CSX", None, jnp.float16), ("CSX", "bfloat16", jnp.bfloat16),
     ("CSX", "float32", jnp.float32), ("CPU", "bfloat16", jnp.bfloat16)],
)
def test_mixed_precision_policy(backend, half, expected):
    seen = {}

    def apply(params, x):
        seen["x"], seen["w"] = x.dtype, params["w"].dtype
        return (x * params["w"]).sum()

    if half is not None:
        cstorch.amp.set_half_dtype(half)
    model = cstorch.compile(cstorch.FunctionalModel(apply, {"w": jnp.ones(4)}), backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        loss = model(x)
        cstorch.backward(loss)
        optimizer.step()
        return loss

    loss = step(jnp.arange(4.0))
    assert seen == {"x": expected, "w": expected}
    assert loss.dtype == jnp.float32  # outputs come back in float32
    (w,) = model.parameters()
    assert w.dtype == jnp.float32  # weights stay float32
    np.testing.assert_allclose(model.state_dict()["w"], 1 - 0.1 * np.arange(4.0), rtol=1e-3)


def test_nnx_module_trains_like_the_functional_equivalent():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc1 = nnx.Linear(8, 16, rngs=rngs)
            self.fc2 = nnx.Linear(16, 4, rngs=rngs)

        def __call__(self, x):
            return self.fc2(jax.nn.tanh(self.fc1(x)))

    net = Net(nnx.Rngs(0))
    init = {"fc1": {"weight": net.fc1.kernel[...], "bias": net.fc1.bias[...]},
            "fc2": {"weight": net.fc2.kernel[...], "bias": net.fc2.bias[...]}}
    model = cstorch.compile(net, "CPU")
    assert sorted(dict(model.named_parameters())) == [
        "fc1.bias", "fc1.kernel", "fc2.bias", "fc2.kernel"]
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    step = xent_step(model, optimizer)

    params = init
    for x, y in batches(5):
        loss = step(x, y)
        ref, grads = jax.value_and_grad(lambda p: xent(mlp_apply(p, x), y))(params)
        params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        np.testing.assert_allclose(loss, ref, rtol=1e-6)
    state = model.state_dict()
    np.testing.assert_allclose(state["fc2.kernel"], params["fc2"]["weight"], rtol=1e-5)


def test_nnx_batchnorm_statistics_update_in_train_mode_only():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc = nnx.Linear(3, 2, rngs=rngs)
            self.bn = nnx.BatchNorm(2, momentum=0.9, rngs=rngs)

        def __call__(self, x):
            return self.bn(self.fc(x))

    model = cstorch.compile(Net(nnx.Rngs(0)), "CPU")
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)

    @cstorch.trace
    def train_step(x):
        return model(x).sum()

    train_step(x)
    w, b = model.state_dict()["fc.kernel"], model.state_dict()["fc.bias"]
    h = x @ w + b
    np.testing.assert_allclose(model.state_dict()["bn.mean"], 0.1 * h.mean(0), rtol=1e-5)
    mean_after_train = model.state_dict()["bn.mean"]
    model.eval()

    @cstorch.trace
    def eval_step(x):
        return model(x).sum()

    eval_step(x)
    np.testing.assert_array_equal(model.state_dict()["bn.mean"], mean_after_train)


def test_nnx_dropout_key_survives_state_dict_and_checkpoint(tmp_path):
    """An nnx module with Dropout keeps a typed PRNG key as state: its state dict holds
    the key's data (uint32, savable), and loading it back restores the same masks."""
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc = nnx.Linear(4, 4, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.drop(self.fc(x))

    model = cstorch.compile(Net(nnx.Rngs(0)), "CPU")
    x = np.ones((8, 4), np.float32)

    @cstorch.trace
    def step(x):
        return model(x)

    step(x)
    state = model.state_dict()
    key = state["drop.rngs.key"]
    assert key.dtype == np.uint32 and key.shape == (2,)  # the default key's data
    cstorch.save({"model": state}, tmp_path / "c.mdl")
    after = [np.asarray(step(x)) for _ in range(2)]
    assert not np.array_equal(after[0], after[1])  # a fresh mask each step
    model.load_state_dict(cstorch.load(tmp_path / "c.mdl")["model"])
    again = [np.asarray(step(x)) for _ in range(2)]
    np.testing.assert_array_equal(again, after)  # the same key and counter: same masks
