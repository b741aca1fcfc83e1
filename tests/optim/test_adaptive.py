"""Adagrad, Adadelta, ASGD, RMSprop and Rprop against torch.optim on the same gradients."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import rel_err

import cerebrax as cstorch
from cerebrax.optim import ASGD, Adadelta, Adagrad, RMSprop, Rprop, transforms

torch = pytest.importorskip("torch")
from optim_harness import (  # noqa: E402
    GivenGradients,
    gradients,
    initial,
    make_step,
    max_param_error,
    max_state_error,
    torch_params,
    torch_step,
)

STEPS = 50
TOLERANCE = 1e-5


# One setting per optimizer whose state has every buffer it can have.
_LOADED = [(Adagrad, "Adagrad", {"lr": 0.05, "lr_decay": 0.01, "initial_accumulator_value": 0.1}),
           (Adadelta, "Adadelta", {"rho": 0.8, "weight_decay": 1e-2}),
           (ASGD, "ASGD", {"lr": 0.05, "t0": 5, "lambd": 1e-3}),
           (RMSprop, "RMSprop", {"lr": 1e-3, "momentum": 0.9, "centered": True}),
           (Rprop, "Rprop", {"lr": 0.05, "etas": (0.4, 1.3)})]


@pytest.mark.parametrize("ours, theirs, kwargs", _LOADED, ids=[c[1] for c in _LOADED])
def test_torch_state_dict_loads_mid_run(ours, theirs, kwargs):
    init, grads = initial(), gradients(30)
    tparams = torch_params(init)
    topt = getattr(torch.optim, theirs)(list(tparams.values()), **kwargs)
    for g in grads[:15]:
        torch_step(topt, tparams, g)
    mine = GivenGradients(init)
    mine.model.load_state_dict({k: v.detach() for k, v in tparams.items()})
    optimizer = ours(mine.ordered, **kwargs)
    optimizer.load_state_dict(topt.state_dict())
    step = make_step(mine.model, optimizer)
    for g in grads[15:]:
        step(g)
        torch_step(topt, tparams, g)
    assert max_param_error(mine, tparams) <= TOLERANCE
    assert max_state_error(optimizer, topt) <= TOLERANCE


@pytest.mark.parametrize("ours, theirs, kwargs", _LOADED, ids=[c[1] for c in _LOADED])
def test_state_before_the_first_step_is_torchs(ours, theirs, kwargs):
    # Adagrad's state exists from construction; the others create theirs lazily.
    mine = GivenGradients(initial())
    optimizer = ours(mine.ordered, **kwargs)
    topt = getattr(torch.optim, theirs)(list(torch_params(initial()).values()), **kwargs)
    assert max_state_error(optimizer, topt) == 0.0


@pytest.mark.parametrize("ours, theirs, kwargs", _LOADED, ids=[c[1] for c in _LOADED])
def test_learning_rate_change_needs_no_recompile(ours, theirs, kwargs):
    init, grads = initial(), gradients(6)
    mine = GivenGradients(init)
    optimizer = ours(mine.ordered, **kwargs)
    step = make_step(mine.model, optimizer)
    tparams = torch_params(init)
    topt = getattr(torch.optim, theirs)(list(tparams.values()), **kwargs)
    for i, g in enumerate(grads):
        # Rprop reads lr once (first step) and ASGD one step late, as in torch.
        optimizer.param_groups[0]["lr"] = topt.param_groups[0]["lr"] = 0.02 / (i + 1)
        step(g)
        torch_step(topt, tparams, g)
    assert step.num_compiles == 1
    assert max_param_error(mine, tparams) <= TOLERANCE
    assert max_state_error(optimizer, topt) <= TOLERANCE


def test_loading_state_without_the_momentum_buffer_is_refused():
    tparams = torch_params(initial())
    topt = torch.optim.RMSprop(list(tparams.values()))
    torch_step(topt, tparams, gradients(1)[0])
    optimizer = RMSprop(GivenGradients(initial()).ordered, momentum=0.9)
    with pytest.raises(cstorch.ConfigError, match="momentum_buffer"):
        optimizer.load_state_dict(topt.state_dict())


_INVALID = [
    (Adagrad, "Adagrad", {"lr": -1.0}),
    (Adagrad, "Adagrad", {"lr_decay": -0.1}),
    (Adagrad, "Adagrad", {"weight_decay": -0.1}),
    (Adagrad, "Adagrad", {"initial_accumulator_value": -1.0}),
    (Adagrad, "Adagrad", {"eps": -1e-8}),
    (Adadelta, "Adadelta", {"lr": -1.0}),
    (Adadelta, "Adadelta", {"rho": 1.5}),
    (Adadelta, "Adadelta", {"eps": -1.0}),
    (Adadelta, "Adadelta", {"weight_decay": -1.0}),
    (ASGD, "ASGD", {"lr": -0.1}),
    (ASGD, "ASGD", {"weight_decay": -0.1}),
    (RMSprop, "RMSprop", {"lr": -0.1}),
    (RMSprop, "RMSprop", {"eps": -0.1}),
    (RMSprop, "RMSprop", {"momentum": -0.1}),
    (RMSprop, "RMSprop", {"weight_decay": -0.1}),
    (RMSprop, "RMSprop", {"alpha": -0.1}),
    (Rprop, "Rprop", {"lr": -0.1}),
    (Rprop, "Rprop", {"etas": (1.5, 1.2)}),
    (Rprop, "Rprop", {"etas": (0.5, 0.9)}),
]


@pytest.mark.parametrize("ours, theirs, kwargs", _INVALID,
                         ids=[f"{c[1]}-{next(iter(c[2]))}-{i}" for i, c in enumerate(_INVALID)])
def test_invalid_hyperparameters_raise_torchs_message(ours, theirs, kwargs):
    with pytest.raises(ValueError) as torch_error:
        getattr(torch.optim, theirs)(list(torch_params(initial()).values()), **kwargs)
    with pytest.raises(cstorch.ConfigError) as error:
        ours(GivenGradients(initial()).ordered, **kwargs)
    assert str(error.value) == str(torch_error.value)


@pytest.mark.parametrize("ours", [Adagrad, Adadelta, ASGD, RMSprop, Rprop])
def test_differentiable_is_refused_and_flags_are_accepted(ours):
    params = GivenGradients(initial()).ordered
    with pytest.raises(cstorch.ConfigError, match="differentiable"):
        ours(params, differentiable=True)
    ours(params, foreach=True)


@pytest.mark.parametrize("ours, static", [(Adadelta, "rho"), (ASGD, "t0"), (RMSprop, "alpha")])
def test_double_precision_hyperparameters_are_part_of_the_graph(ours, static):
    mine = GivenGradients(initial())
    optimizer = ours(mine.ordered)
    make_step(mine.model, optimizer)(gradients(1)[0])
    with pytest.raises(cstorch.StateError, match="part of the compiled step"):
        optimizer.param_groups[0][static] = 0.5


# ---- the pure optax factories -----------------------------------------------------------
_FACTORIES = [
    ("adagrad", lambda: transforms.adagrad(0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
    ("adadelta", lambda: transforms.adadelta(1.0, rho=0.9, weight_decay=0.01)),
    ("asgd", lambda: transforms.asgd(0.05, t0=2)),
    ("rmsprop", lambda: transforms.rmsprop(0.01, momentum=0.9, centered=True)),
    ("rprop", lambda: transforms.rprop(0.01)),
]


_STATES = (transforms.AdagradState, transforms.AdadeltaState, transforms.ASGDState,
           transforms.RMSpropState, transforms.RpropState)


@pytest.mark.parametrize("name, make", _FACTORIES, ids=[f[0] for f in _FACTORIES])
def test_factory_state_is_stable_under_jit(name, make):
    tx = make()
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    shapes = jax.eval_shape(tx.init, jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params))
    state = tx.init(params)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), shapes) == \
        jax.tree.map(lambda x: (x.shape, x.dtype), state)

    @jax.jit
    @chex.assert_max_traces(n=1)  # a retrace would mean the state changed type
    def step(params, state, g):
        updates, state = tx.update(g, state, params)
        return optax.apply_updates(params, updates), state

    rng = np.random.default_rng(0)
    for _ in range(3):
        g = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
        new_params, new_state = step(params, state, g)
        assert jax.tree.structure(new_state) == jax.tree.structure(state)
        assert jax.tree.map(lambda x: x.dtype, new_state) == jax.tree.map(lambda x: x.dtype, state)
        params, state = new_params, new_state
    own = [s for s in state if isinstance(s, _STATES)]
    assert len(own) == 1 and own[0].count.dtype == jnp.int32 and int(own[0].count) == 3


def test_factory_matches_torch_without_the_class():
    init, grads = initial(), gradients(10)
    tx = transforms.rmsprop(0.01, centered=True, momentum=0.5, weight_decay=0.01)
    params = {k: jnp.asarray(v) for k, v in init.items()}
    state = tx.init(params)
    tparams = torch_params(init)
    topt = torch.optim.RMSprop(list(tparams.values()), lr=0.01, centered=True, momentum=0.5,
                               weight_decay=0.01)
    for g in grads:
        updates, state = tx.update({k: jnp.asarray(v) for k, v in g.items()}, state, params)
        params = optax.apply_updates(params, updates)
        torch_step(topt, tparams, g)
    for k, p in tparams.items():
        assert rel_err(params[k], p.detach().numpy()) <= TOLERANCE, k
