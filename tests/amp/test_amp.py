"""GradScaler, optimizer_step and the half dtype."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import batches, compiled_mlp, mlp_apply, mlp_params, xent

import cerebrax as cstorch


def _setup(backend="CSX", **scaler_kwargs):
    model = compiled_mlp(backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = cstorch.optim.lr_scheduler.LinearLR(optimizer, 1e-2, 1e-3, total_iters=10)
    scaler = cstorch.amp.GradScaler(**scaler_kwargs)

    @cstorch.trace
    def step(x, y, poison):
        # poison = 1 gives a finite loss whose gradient is inf for every parameter.
        logits = model(x)
        loss = xent(logits, y) + poison * jnp.float32(3e38) * jnp.sum(logits) ** 2
        cstorch.amp.optimizer_step(loss, optimizer, scaler)
        scheduler.step()
        return loss

    return model, optimizer, scheduler, scaler, step


def _snapshot(model, optimizer, scheduler):
    return (model.state_dict(), jax.device_get(optimizer._tx_state._value),
            scheduler.state_dict(), optimizer.param_groups[0]["lr"])


def test_inf_gradient_skips_the_step_and_halves_the_scale():
    model, optimizer, scheduler, scaler, step = _setup(loss_scale="dynamic", init_scale=1024.0)
    data = batches(4)
    step(*data[0], jnp.float32(0))
    step(*data[1], jnp.float32(0))
    before = _snapshot(model, optimizer, scheduler)
    assert scaler.state_dict()["loss_scale"] == 1024.0
    step(*data[2], jnp.float32(1))
    after = _snapshot(model, optimizer, scheduler)
    chex.assert_trees_all_equal(before, after)  # params, optimizer state, schedule: unchanged
    state = scaler.state_dict()
    assert state["loss_scale"] == 512.0
    assert state["num_skipped_steps"] == 1
    assert state["overflows_since_rescale"] == 0 and state["steps_since_rescale"] == 0
    step(*data[3], jnp.float32(0))  # training resumes
    assert scheduler.state_dict()["last_epoch"] == before[2]["last_epoch"] + 1
    assert not np.array_equal(model.state_dict()["fc1.bias"], before[0]["fc1.bias"])


def test_dynamic_scale_doubles_after_steps_per_increase():
    _, _, _, scaler, step = _setup(loss_scale="dynamic", init_scale=8.0, steps_per_increase=3)
    scales = []
    for x, y in batches(8):
        step(x, y, jnp.float32(0))
        scales.append(scaler.state_dict()["loss_scale"])
    # steps_since_rescale must exceed steps_per_increase (cstorch's rule).
    assert scales == [8.0, 8.0, 8.0, 16.0, 16.0, 16.0, 16.0, 32.0]


def test_dynamic_scale_is_clamped():
    _, _, _, scaler, step = _setup(loss_scale="dynamic", init_scale=4.0, min_loss_scale=2.0)
    for x, y in batches(3):
        step(x, y, jnp.float32(1))
    assert scaler.state_dict()["loss_scale"] == 2.0


def test_overflow_tolerance_delays_halving():
    _, _, _, scaler, step = _setup(loss_scale="dynamic", init_scale=64.0,
                                   overflow_tolerance=0.5)
    data = batches(3)
    step(*data[0], jnp.float32(0))
    step(*data[1], jnp.float32(1))  # 1 overflow in 2 steps: 0.5 is not > 0.5
    assert scaler.state_dict()["loss_scale"] == 64.0
    step(*data[2], jnp.float32(1))  # 2 in 3
    assert scaler.state_dict()["loss_scale"] == 32.0


def test_scaled_training_matches_unscaled_training():
    cstorch.amp.set_half_dtype("float32")  # compare the scaling alone, in float32
    results = []
    for kwargs in ({"loss_scale": "dynamic", "init_scale": 256.0}, {"loss_scale": 128.0}, {}):
        cstorch.reset()
        cstorch.amp.set_half_dtype("float32")
        model, _, _, _, step = _setup(**kwargs)
        losses = [float(step(x, y, jnp.float32(0))) for x, y in batches(5)]
        results.append((losses, model.state_dict()))
    for losses, state in results[1:]:
        np.testing.assert_allclose(losses, results[0][0], rtol=1e-5)
        chex.assert_trees_all_close(state, results[0][1], rtol=1e-4, atol=1e-7)


def test_scaler_is_inactive_on_cpu():
    model, _, _, scaler, step = _setup(backend="CPU", loss_scale="dynamic")
    losses = [step(x, y, jnp.float32(0)) for x, y in batches(3)]
    assert scaler.state_dict() == {}
    scaled = scaler.scale(losses[0])
    assert float(scaled.value) == float(losses[0])


def test_mixed_precision_training_tracks_float32():
    """float16 compute with dynamic scaling follows the float32 run closely."""
    curves = {}
    for half in ("float16", "float32"):
        cstorch.reset()
        cstorch.amp.set_half_dtype(half)
        _, _, _, _, step = _setup(loss_scale="dynamic")
        curves[half] = [float(step(x, y, jnp.float32(0))) for x, y in batches(10)]
    np.testing.assert_allclose(curves["float16"], curves["float32"], rtol=5e-3)


def test_unscale_after_step_is_refused():
    model = compiled_mlp("CSX")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")

    @cstorch.trace
    def step(x, y):
        loss = xent(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.unscale_(optimizer)
        return loss

    with pytest.raises(cstorch.StateError, match=r"unscale_\(\) is being called after step\(\)"):
        step(*batches(1)[0])


def test_second_step_before_update_is_refused():
    model = compiled_mlp("CSX")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")

    @cstorch.trace
    def step(x, y):
        loss = xent(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.step(optimizer)
        return loss

    with pytest.raises(cstorch.StateError, match="already been called since the last update"):
        step(*batches(1)[0])


@pytest.mark.parametrize(
    "kwargs, match",
    [({"loss_scale": "dynamic", "min_loss_scale": 1e-6}, "min_loss_scale too small"),
     ({"loss_scale": "dynamic", "overflow_tolerance": -0.1}, "overflow_tolerance"),
     ({"loss_scale": "static"}, "'dynamic' or a number"),
     ({"loss_scale": -4.0}, "must be > 0")],
)
def test_grad_scaler_argument_errors(kwargs, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        cstorch.amp.GradScaler(**kwargs)


def test_update_with_a_new_scale_is_refused():
    model = compiled_mlp("CSX")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")

    @cstorch.trace
    def step(x, y):
        loss = xent(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update(2.0)
        return loss

    with pytest.raises(cstorch.ConfigError, match="does not take a new scale"):
        step(*batches(1)[0])


def test_optimizer_step_refuses_both_clipping_modes():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        loss = xent(model(x), y)
        cstorch.amp.optimizer_step(loss, optimizer, max_gradient_norm=1.0, max_gradient_value=1.0)
        return loss

    with pytest.raises(cstorch.ConfigError, match="not both"):
        step(*batches(1)[0])


def test_optimizer_step_clips_by_value():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)

    @cstorch.trace
    def step(x, y):
        loss = xent(model(x), y)
        cstorch.amp.optimizer_step(loss, optimizer, max_gradient_value=1e-3)
        return loss

    x, y = batches(1)[0]
    step(x, y)
    grads = jax.grad(lambda p: xent(mlp_apply(p, x), y))(mlp_params())
    want = jax.tree.map(lambda p, g: p - jnp.clip(g, -1e-3, 1e-3), mlp_params(), grads)
    np.testing.assert_allclose(model.state_dict()["fc1.weight"], want["fc1"]["weight"], rtol=1e-6)


def test_set_half_dtype_validates_and_returns_the_dtype():
    assert cstorch.amp.set_half_dtype("bfloat16") == jnp.bfloat16
    assert cstorch.amp.get_half_dtype_str() == "bfloat16"
    assert cstorch.amp.set_half_dtype("cbfloat16") == jnp.float16
    with pytest.raises(cstorch.ConfigError, match="set_half_dtype"):
        cstorch.amp.set_half_dtype("int8")


def test_dynamic_scale_is_capped_by_max_loss_scale():
    _, _, _, scaler, step = _setup(loss_scale="dynamic", init_scale=2.0**20,
                                   max_loss_scale=64.0, steps_per_increase=1)
    assert scaler.state_dict()["loss_scale"] == 64.0  # init is clamped to the max
    for x, y in batches(4):
        step(x, y, jnp.float32(0))
    assert scaler.state_dict()["loss_scale"] == 64.0  # growth stops at the max


def test_grad_scaler_state_dict_round_trip():
    _, _, _, scaler, step = _setup(loss_scale="dynamic", init_scale=32.0, steps_per_increase=2)
    data = batches(3)
    step(*data[0], jnp.float32(0))
    step(*data[1], jnp.float32(1))
    state = scaler.state_dict()
    assert state == {"loss_scale": 16.0, "steps_since_rescale": 0,
                     "overflows_since_rescale": 0, "num_skipped_steps": 1}
    other = cstorch.amp.GradScaler(loss_scale="dynamic")
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_max_gradient_norm_argument_is_deprecated():
    with pytest.warns(DeprecationWarning, match="optimizer_step"):
        cstorch.amp.GradScaler(loss_scale="dynamic", max_gradient_norm=1.0)
