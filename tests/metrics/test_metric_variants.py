"""The pure pieces of every metric with and without jit (chex variants).

A metric is ``_initial_state`` (the accumulators), ``_update(state, *batch)`` (new
accumulators, pure) and ``_compute(state)`` (the value, pure); ``Metric.update`` and
``compute`` only move the state in and out of registered state. Here the pure pieces
run on their own, transformed, and the value is compared with the float64 NumPy
reference of metric_cases.py.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized
from metric_cases import CASES, draw, reference

_BY_ID = {case.id: case for case in CASES}


class MetricVariantsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*[(case.id, case.id) for case in CASES])
    def test_update_and_compute_match_numpy(self, case_id):
        case = _BY_ID[case_id]
        metric = case.make()
        update, compute = self.variant(metric._update), self.variant(metric._compute)
        state = metric._initial_state()
        data = draw(case, seed=4)
        for batch in data:
            new_state = update(state, **batch)
            chex.assert_trees_all_equal_shapes_and_dtypes(new_state, state)
            state = new_state
        value = compute(state)
        chex.assert_shape(value, ())
        chex.assert_type(value, jnp.float32)
        np.testing.assert_allclose(float(value), reference(case, data), rtol=1e-5, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*[(case.id, case.id) for case in CASES])
    def test_the_fresh_state_is_zero_and_updates_add(self, case_id):
        """Updating with two batches gives the sum of what each adds to a fresh state."""
        case = _BY_ID[case_id]
        metric = case.make()
        update = self.variant(metric._update)
        fresh = metric._initial_state()
        first, second = draw(case, seed=5, n=2)
        both = update(update(fresh, **first), **second)
        added = jax.tree.map(lambda a, b, z: a + b - z,
                             update(fresh, **first), update(fresh, **second), fresh)
        chex.assert_trees_all_close(both, added, rtol=1e-6, atol=1e-5)
        chex.assert_trees_all_equal(jax.tree.map(jnp.zeros_like, fresh), fresh)
