"""Every pure schedule of ``cerebrax.schedules`` with and without jit (chex variants),
against its float64 NumPy closed form (schedule_cases.py)."""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized
from schedule_cases import CASES, FACTORIES, REFERENCES, assert_lrs

from cerebrax import schedules

HORIZON = 2000

# The composites, built from other schedules, with their float64 closed forms.
_COMPOSITES = {
    "sequential": (
        lambda: schedules.sequential(
            [schedules.linear(0.0, 0.1, 100), schedules.cosine_decay(0.1, 0.001, 1400),
             schedules.constant(0.001)], [100, 1500]),
        lambda t: np.where(
            t < 100, REFERENCES["LinearLR"](t, 0.0, 0.1, 100),
            np.where(t < 1500, REFERENCES["CosineDecayLR"](t - 100, 0.1, 0.001, 1400), 0.001))),
    "chained": (
        lambda: schedules.chained([schedules.piecewise_constant([0.1, 0.05], [1000]),
                                   schedules.exponential(2.0, 1, 0.999)]),
        lambda t: np.where(t < 1000, 0.1, 0.05) * 0.999**t),
}


class ScheduleVariantsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*[(case, case) for case in CASES])
    def test_matches_the_closed_form(self, case):
        cls, arguments = CASES[case]
        kwargs = arguments(HORIZON)
        got = self.variant(FACTORIES[cls](**kwargs))(jnp.arange(HORIZON))
        chex.assert_shape(got, (HORIZON,))
        chex.assert_type(got, jnp.float32)
        assert_lrs(got, REFERENCES[cls](np.arange(HORIZON, dtype=np.float64), **kwargs))

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*[(name, name) for name in _COMPOSITES])
    def test_composite_matches_the_closed_form(self, name):
        make, reference = _COMPOSITES[name]
        got = self.variant(make())(jnp.arange(HORIZON))
        chex.assert_type(got, jnp.float32)
        assert_lrs(got, reference(np.arange(HORIZON, dtype=np.float64)))

    @chex.variants(with_jit=True, without_jit=True)
    def test_a_scalar_step_gives_a_scalar(self):
        schedule = self.variant(schedules.cosine_decay(1.0, 0.0, 10))
        got = schedule(jnp.int32(5))
        chex.assert_shape(got, ())
        assert_lrs(got, 0.5)


def test_every_schedule_is_covered():
    """A new schedule function in cerebrax.schedules needs a case in one of the tables."""
    functions = {name for name, value in vars(schedules).items()
                 if name.islower() and not name.startswith("_") and callable(value)}
    covered = {FACTORIES[cls].__name__ for cls, _ in CASES.values()} | set(_COMPOSITES)
    covered.add("constant")  # FACTORIES wraps it in a lambda (it takes no total_iters)
    assert functions - {"configure_lr_scheduler"} == covered - {"<lambda>"}
