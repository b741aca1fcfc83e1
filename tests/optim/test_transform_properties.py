"""An optax factory's update is the same under jit and without, for random parameters,
gradients and hyperparameters in their valid ranges (hypothesis).

Each example runs three updates of one factory of ``cerebrax.optim.transforms`` both
ways from the same parameters and compares the parameters and the whole optimizer state
(counters exactly, floats to float32 rounding).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cerebrax.optim import transforms

# Ten examples per factory (150 in all), as every example compiles its own update.
# conftest's autouse fixture is per test, not per example; the updates are pure, so the
# examples share nothing through it.
PROPERTY = settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])

SHAPES = {"w": (4, 3), "b": (3,), "s": ()}
UPDATES = 3

lr = st.floats(1e-4, 1.0)
b1 = st.floats(0.0, 0.99)
b2 = st.floats(0.5, 0.9999)
eps = st.floats(1e-8, 1e-3)
wd = st.floats(0.0, 0.5)
flag = st.booleans()


def _args(**strategies):
    return st.fixed_dictionaries(strategies)


# factory name -> the strategy of its keyword arguments (valid hyperparameters only)
HYPERPARAMETERS = {
    "sgd": _args(learning_rate=lr, momentum=st.floats(0.0, 0.99),
                 dampening=st.floats(0.0, 0.9), weight_decay=wd, maximize=flag),
    "sgd_nesterov": _args(learning_rate=lr, momentum=st.floats(0.1, 0.99), weight_decay=wd,
                          nesterov=st.just(True), maximize=flag),
    "adam": _args(learning_rate=lr, b1=b1, b2=b2, eps=eps, weight_decay=wd, amsgrad=flag,
                  maximize=flag, decoupled_weight_decay=flag),
    "adamw": _args(learning_rate=lr, b1=b1, b2=b2, eps=eps, weight_decay=wd, amsgrad=flag,
                   maximize=flag, correct_bias=flag),
    "adamax": _args(learning_rate=lr, b1=b1, b2=b2, eps=eps, weight_decay=wd, maximize=flag),
    "nadam": _args(learning_rate=lr, b1=b1, b2=b2, eps=eps, weight_decay=wd,
                   momentum_decay=st.floats(0.0, 0.01), maximize=flag,
                   decoupled_weight_decay=flag),
    "radam": _args(learning_rate=lr, b1=b1, b2=b2, eps=eps, weight_decay=wd, maximize=flag,
                   decoupled_weight_decay=flag),
    "adagrad": _args(learning_rate=lr, lr_decay=st.floats(0.0, 0.1), weight_decay=wd,
                     initial_accumulator_value=st.floats(0.0, 1.0), eps=eps, maximize=flag),
    "adadelta": _args(learning_rate=st.floats(0.01, 2.0), rho=st.floats(0.5, 0.99), eps=eps,
                      weight_decay=wd, maximize=flag),
    "asgd": _args(learning_rate=lr, lambd=st.floats(0.0, 1e-2), alpha=st.floats(0.1, 1.0),
                  t0=st.floats(0.0, 10.0), weight_decay=wd, maximize=flag),
    "rmsprop": _args(learning_rate=lr, alpha=st.floats(0.5, 0.999), eps=eps, weight_decay=wd,
                     momentum=st.floats(0.0, 0.9), centered=flag, maximize=flag),
    "rprop": _args(learning_rate=lr, etas=st.tuples(st.floats(0.1, 0.9), st.floats(1.01, 2.0)),
                   step_sizes=st.tuples(st.floats(1e-6, 1e-3), st.floats(1.0, 50.0)),
                   maximize=flag),
    "lamb": _args(learning_rate=lr, b1=b1, b2=b2, eps=eps, weight_decay=wd, adam=flag,
                  maximize=flag),
    "lion": _args(learning_rate=lr, b1=b1, b2=b2, weight_decay=wd, maximize=flag),
    "adafactor": _args(learning_rate=lr, beta2_decay=st.floats(-1.0, -0.5),
                       eps2=st.floats(1e-4, 1e-2), d=st.floats(1.0, 2.0), weight_decay=wd,
                       maximize=flag),
}


def _tree(shapes):
    elements = st.floats(-10.0, 10.0, width=32)
    return st.fixed_dictionaries(
        {k: hnp.arrays(np.float32, shape, elements=elements) for k, shape in shapes.items()})


def _run(update, tx, params, grads):
    state = tx.init(params)
    for g in grads:
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


@pytest.mark.parametrize("name", HYPERPARAMETERS)
@PROPERTY
@given(data=st.data())
def test_update_under_jit_equals_the_update_without(name, data):
    kwargs = data.draw(HYPERPARAMETERS[name], label="hyperparameters")
    params = jax.tree.map(jnp.asarray, data.draw(_tree(SHAPES), label="params"))
    grads = [data.draw(_tree(SHAPES), label=f"grads {i}") for i in range(UPDATES)]
    tx = getattr(transforms, name.removesuffix("_nesterov"))(**kwargs)
    eager = _run(tx.update, tx, params, grads)
    chex.clear_trace_counter()  # per example: conftest clears it per test
    jitted = _run(jax.jit(chex.assert_max_traces(tx.update, n=1)), tx, params, grads)
    chex.assert_trees_all_equal_structs(jitted, eager)
    chex.assert_trees_all_equal_shapes_and_dtypes(jitted, eager)
    # Parameters and gradients are drawn from [-10, 10]: 1e-5 is ~10 float32 ulps there.
    chex.assert_trees_all_close(jitted, eager, rtol=1e-5, atol=1e-5)
