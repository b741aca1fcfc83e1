"""The dynamic loss-scale rule of ``GradScaler``, as a pure function, with and without jit.

cerebrax applies the rule inside ``GradScaler.update()``, to registered state and only
inside a traced step, so there is no pure function of it to transform. The rule is
written out here as one (cstorch's rule: halve when the overflows since the last rescale
exceed ``overflow_tolerance`` of the steps, double after more than
``steps_per_increase`` steps without, clamp to ``[min_loss_scale, max_loss_scale]``),
run under the chex variants, and compared step by step with a ``GradScaler`` driven
through traced CSX steps on the same sequence of finite and overflowing steps.
"""

from __future__ import annotations

import functools

import chex
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

import cerebrax as cstorch

STEPS = 24


def loss_scale_rule(state, finite, *, steps_per_increase, overflow_tolerance, min_loss_scale,
                    max_loss_scale):
    """The scaler state after one step whose gradients were ``finite`` (or not)."""
    overflow = jnp.logical_not(finite).astype(jnp.int32)
    steps = state["steps_since_rescale"] + 1
    overflows = state["overflows_since_rescale"] + overflow
    halve = overflows.astype(jnp.float32) / steps.astype(jnp.float32) > overflow_tolerance
    double = jnp.logical_and(jnp.logical_not(halve), steps > steps_per_increase)
    scale = state["loss_scale"] * jnp.where(halve, 0.5, jnp.where(double, 2.0, 1.0))
    rescaled = jnp.logical_or(halve, double)
    return {
        "loss_scale": jnp.clip(scale, min_loss_scale, max_loss_scale),
        "steps_since_rescale": jnp.where(rescaled, 0, steps),
        "overflows_since_rescale": jnp.where(rescaled, 0, overflows),
        "num_skipped_steps": state["num_skipped_steps"] + overflow,
    }


def _traced_scaler_states(finite_steps, **scaler_kwargs):
    """The state_dict of a dynamic GradScaler after each traced step; an overflowing step
    has a finite loss whose gradient is inf."""
    cstorch.backend("CSX")
    model = cstorch.compile(cstorch.FunctionalModel(
        lambda p, x: jnp.sum(p["w"] * x), {"w": jnp.full(2, 0.1)}))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic", **scaler_kwargs)

    @cstorch.trace
    def step(x, poison):
        out = model(x)
        loss = out + poison * jnp.float32(3e38) * out.astype(jnp.float32) ** 2
        cstorch.amp.optimizer_step(loss, optimizer, scaler)
        return loss

    states = []
    for finite in finite_steps:
        step(jnp.full(2, 0.5), jnp.float32(0.0 if finite else 1.0))
        states.append(scaler.state_dict())
    assert step.num_compiles == 1
    return states


_SETTINGS = [
    ("no_tolerance", dict(init_scale=2.0**10, steps_per_increase=3), 0.7),
    ("tolerance", dict(init_scale=64.0, steps_per_increase=4, overflow_tolerance=0.3), 0.6),
    ("clamped", dict(init_scale=8.0, steps_per_increase=1, min_loss_scale=2.0,
                     max_loss_scale=32.0), 0.5),
    ("at_the_cap", dict(steps_per_increase=2), 0.9),
]


class GradScalerRuleTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*_SETTINGS)
    def test_traced_scaler_follows_the_rule(self, scaler_kwargs, finite_fraction):
        rng = np.random.default_rng(len(scaler_kwargs))
        finite_steps = [bool(f) for f in rng.random(STEPS) < finite_fraction]
        max_scale = scaler_kwargs.get("max_loss_scale", 2.0**15)
        rule = self.variant(functools.partial(
            loss_scale_rule,
            steps_per_increase=scaler_kwargs["steps_per_increase"],
            overflow_tolerance=scaler_kwargs.get("overflow_tolerance", 0.0),
            min_loss_scale=scaler_kwargs.get("min_loss_scale", 2.0**-14),
            max_loss_scale=max_scale))
        state = {"loss_scale": jnp.float32(min(max_scale, scaler_kwargs.get("init_scale",
                                                                            2.0**15))),
                 "steps_since_rescale": jnp.int32(0), "overflows_since_rescale": jnp.int32(0),
                 "num_skipped_steps": jnp.int32(0)}
        expected = []
        for finite in finite_steps:
            state = rule(state, jnp.bool_(finite))
            expected.append({k: v.item() for k, v in state.items()})
        got = _traced_scaler_states(finite_steps, **scaler_kwargs)
        assert got == expected
        assert got[-1]["num_skipped_steps"] == finite_steps.count(False) > 0
