"""cstorch's GradScaler methods beyond torch's, and ``amp.isfinite`` / ``update_if_finite``.

References: the dynamic scale rule worked by hand (halve per overflow, floor at
``min_loss_scale``), ``optimizer_step``'s own sequence, and a jax.grad + clip by
global norm update written out in numpy.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import batches, compiled_mlp, mlp_apply, mlp_params, xent

import cerebrax as cstorch
from cerebrax import _step


def _poisoned(loss, logits, poison):
    # poison = 1 keeps the loss finite but makes every gradient inf.
    return loss + poison * jnp.float32(3e38) * jnp.sum(logits) ** 2


def _scaler_run(make_step, poisons, **scaler_kwargs):
    model = compiled_mlp("CSX")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = cstorch.amp.GradScaler(**scaler_kwargs)
    step = make_step(model, optimizer, scaler)
    outs = [step(x, y, jnp.float32(p)) for (x, y), p in zip(batches(len(poisons)), poisons)]
    return model, scaler, outs


def _optimizer_step(model, optimizer, scaler):
    @cstorch.trace
    def step(x, y, poison):
        logits = model(x)
        cstorch.amp.optimizer_step(_poisoned(xent(logits, y), logits, poison), optimizer,
                                   scaler)
        return cstorch.amp.isfinite(optimizer)

    return step


def _step_if_finite(model, optimizer, scaler):
    @cstorch.trace
    def step(x, y, poison):
        logits = model(x)
        optimizer.zero_grad()
        scaler.scale(_poisoned(xent(logits, y), logits, poison)).backward()
        scaler.unscale_(optimizer)
        scaler.step_if_finite(optimizer)
        scaler.update()
        return poison

    return step


POISONS = [0, 1, 0, 1, 1, 0]


def test_num_skipped_steps_counts_the_non_finite_steps():
    _, scaler, finite = _scaler_run(_optimizer_step, POISONS, loss_scale="dynamic")
    assert [bool(f) for f in finite] == [not p for p in POISONS]
    assert int(scaler.get_num_skipped_steps()) == sum(POISONS)
    _, static, _ = _scaler_run(_optimizer_step, [0, 0], loss_scale=8.0)
    assert int(static.get_num_skipped_steps()) == 0


def test_step_if_finite_trains_like_step():
    want_model, want_scaler, _ = _scaler_run(_optimizer_step, POISONS, loss_scale="dynamic",
                                             init_scale=2.0**10)
    cstorch.reset()
    model, scaler, _ = _scaler_run(_step_if_finite, POISONS, loss_scale="dynamic",
                                   init_scale=2.0**10)
    assert int(scaler.get_num_skipped_steps()) == sum(POISONS)
    chex.assert_trees_all_equal(model.state_dict(), want_model.state_dict())
    assert scaler.state_dict() == want_scaler.state_dict()


def test_step_if_finite_needs_a_finite_flag():
    def make(model, optimizer, scaler):
        @cstorch.trace
        def step(x, y, poison):
            scaler.scale(xent(model(x), y)).backward()
            scaler.step_if_finite(optimizer)
            return poison

        return step

    with pytest.raises(cstorch.StateError, match="step_if_finite.*unscale_"):
        _scaler_run(make, [0], loss_scale="dynamic")


def test_non_clamped_scale_goes_below_the_floor():
    floor = 2.0**-14
    _, scaler, _ = _scaler_run(_optimizer_step, [1, 1, 1], loss_scale="dynamic",
                               init_scale=2.0**-12, min_loss_scale=floor)
    # Three overflows halve 2**-12 three times: 2**-15, held at the floor 2**-14.
    assert float(scaler.get_scale()) == floor
    assert float(scaler.get_non_clamped_scale()) == 2.0**-15
    _, static, _ = _scaler_run(_optimizer_step, [0], loss_scale=4.0)
    assert float(static.get_non_clamped_scale()) == 4.0


@pytest.mark.parametrize("direct", [True, False])
def test_update_scale_is_the_rule_update_runs(direct):
    def make(model, optimizer, scaler):
        @cstorch.trace
        def step(x, y, poison):
            logits = model(x)
            scaler.scale(_poisoned(xent(logits, y), logits, poison)).backward()
            scaler.step(optimizer)
            if direct:
                scaler.update_scale([optimizer])
            else:
                scaler.update()
            return poison

        return step

    _, scaler, _ = _scaler_run(make, [1, 0, 0], loss_scale="dynamic", init_scale=64.0,
                               steps_per_increase=1)
    # Overflow: 64 -> 32 (counters reset); two finite steps, the second past
    # steps_per_increase=1: 32 -> 64.
    assert scaler.state_dict() == {"loss_scale": 64.0, "steps_since_rescale": 0,
                                   "overflows_since_rescale": 0, "num_skipped_steps": 1}


def test_clip_gradients_and_return_isfinite_clips_by_the_global_norm():
    cstorch.amp.set_half_dtype("float32")  # compare the arithmetic in float32
    max_norm, lr = 0.05, 0.1
    model = compiled_mlp("CSX")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=lr)
    with pytest.warns(DeprecationWarning, match="clip_gradients_and_return_isfinite"):
        scaler = cstorch.amp.GradScaler(loss_scale=8.0, max_gradient_norm=max_norm)

    @cstorch.trace
    def step(x, y):
        scaler.scale(xent(model(x), y)).backward()
        finite = scaler.clip_gradients_and_return_isfinite([optimizer])
        scaler.step(optimizer)
        scaler.update()
        return finite

    x, y = batches(1)[0]
    assert bool(step(x, y))
    params = mlp_params()
    grads = jax.grad(lambda p: xent(mlp_apply(p, x), y))(params)
    norm = np.sqrt(sum(float(jnp.sum(g**2)) for g in jax.tree.leaves(grads)))
    assert norm > max_norm  # the clip is active
    coef = max_norm / (norm + 1e-6)
    for layer in params:
        for name in params[layer]:
            want = params[layer][name] - lr * coef * grads[layer][name]
            np.testing.assert_allclose(model.state_dict()[f"{layer}.{name}"], want,
                                       rtol=1e-5, atol=1e-7)


class _CountingSGD(cstorch.optim.SGD):
    """SGD that also counts its steps in state of its own, outside ``self.state``."""

    def __init__(self, params, counter, **kwargs):
        super().__init__(params, **kwargs)
        self.counter = counter

    def step(self, closure=None):
        super().step()
        self.counter.value = self.counter.value + 1.0


def test_update_if_finite_keeps_marked_state_in_a_skipped_step():
    def run(mark: bool) -> list[float]:
        cstorch.reset()
        model = compiled_mlp("CSX")
        counter = _step.StateRef(jnp.float32(0), name="custom counter")
        optimizer = _CountingSGD(model.parameters(), counter, lr=0.1)
        scaler = cstorch.amp.GradScaler(loss_scale="dynamic")
        if mark:
            cstorch.amp.update_if_finite(optimizer, counter)

        @cstorch.trace
        def step(x, y, poison):
            logits = model(x)
            cstorch.amp.optimizer_step(_poisoned(xent(logits, y), logits, poison),
                                       optimizer, scaler)
            return poison

        seen = []
        for (x, y), p in zip(batches(4), [0, 1, 0, 1]):
            step(x, y, jnp.float32(p))
            seen.append(float(counter.value))
        return seen

    assert run(mark=True) == [1.0, 1.0, 2.0, 2.0]  # the skipped steps left it alone
    assert run(mark=False) == [1.0, 2.0, 3.0, 4.0]


def test_isfinite_outside_a_step_and_without_scaling_is_true():
    model = compiled_mlp("CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    assert cstorch.amp.isfinite(optimizer) is True
