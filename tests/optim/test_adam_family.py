"""Adam, Adamax, NAdam and RAdam against torch.optim: same gradients in, same results out."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cerebrax as cstorch
from cerebrax.optim import Adam, Adamax, NAdam, RAdam, transforms

torch = pytest.importorskip("torch")
from cstorch_defaults import as_torch  # noqa: E402
from optim_harness import (  # noqa: E402
    GivenGradients,
    gradients,
    initial,
    make_step,
    max_param_error,
    max_state_error,
    run_both,
    torch_params,
    torch_step,
)

STEPS = 50
TOLERANCE = 1e-5


def test_adam_with_a_zero_beta1():
    (ours, optimizer, _), (theirs, torch_optimizer) = run_both(
        Adam, torch.optim.Adam, as_torch("Adam", {"lr": 1e-2, "betas": (0.0, 0.99)}), STEPS
    )
    assert max_param_error(ours, theirs) <= TOLERANCE
    assert max_state_error(optimizer, torch_optimizer) <= TOLERANCE


LOAD_CASES = [
    (Adam, "Adam", {"lr": 1e-2, "amsgrad": True, "weight_decay": 0.01}),
    (Adamax, "Adamax", {"lr": 1e-2, "weight_decay": 0.01}),
    (NAdam, "NAdam", {"lr": 1e-2, "momentum_decay": 0.01}),
    (RAdam, "RAdam", {"lr": 1e-2, "decoupled_weight_decay": True, "weight_decay": 0.1}),
]


@pytest.mark.parametrize("ours_cls, torch_name, kwargs", LOAD_CASES, ids=[c[1] for c in LOAD_CASES])
def test_torch_state_dict_loads_mid_run(ours_cls, torch_name, kwargs):
    init, grads = initial(), gradients(30)
    theirs = torch_params(init)
    torch_optimizer = getattr(torch.optim, torch_name)(list(theirs.values()), **kwargs)
    for g in grads[:15]:
        torch_step(torch_optimizer, theirs, g)
    ours = GivenGradients(init)
    ours.model.load_state_dict({k: v.detach() for k, v in theirs.items()})
    optimizer = ours_cls(ours.ordered, **kwargs)
    optimizer.load_state_dict(torch_optimizer.state_dict())
    assert max_state_error(optimizer, torch_optimizer) == 0.0
    step = make_step(ours.model, optimizer)
    for g in grads[15:]:
        step(g)
        torch_step(torch_optimizer, theirs, g)
    assert max_param_error(ours, theirs) <= TOLERANCE
    assert max_state_error(optimizer, torch_optimizer) <= TOLERANCE


@pytest.mark.parametrize("ours_cls, torch_name, kwargs", LOAD_CASES, ids=[c[1] for c in LOAD_CASES])
def test_loading_a_state_from_before_the_first_step_resets(ours_cls, torch_name, kwargs):
    init, grads = initial(), gradients(10)
    theirs = torch_params(init)
    torch_optimizer = getattr(torch.optim, torch_name)(list(theirs.values()), **kwargs)
    ours = GivenGradients(init)
    optimizer = ours_cls(ours.ordered, **kwargs)
    step = make_step(ours.model, optimizer)
    step(grads[0])  # some state, then torch's empty one replaces it
    ours.model.load_state_dict({k: v.detach() for k, v in theirs.items()})
    optimizer.load_state_dict(torch_optimizer.state_dict())
    assert optimizer.state_dict()["state"] == {}
    for g in grads:
        step(g)
        torch_step(torch_optimizer, theirs, g)
    assert step.num_compiles == 1
    assert max_param_error(ours, theirs) <= TOLERANCE


@pytest.mark.parametrize("ours_cls, torch_name, kwargs", LOAD_CASES, ids=[c[1] for c in LOAD_CASES])
def test_state_dict_round_trip_is_the_identity(ours_cls, torch_name, kwargs):
    del torch_name
    ours = GivenGradients(initial())
    optimizer = ours_cls(ours.ordered, **kwargs)
    make_step(ours.model, optimizer)(gradients(1)[0])
    saved = optimizer.state_dict()
    other = ours_cls(GivenGradients(initial()).ordered, **kwargs)
    other.load_state_dict(saved)
    again = other.state_dict()
    assert sorted(again["state"]) == sorted(saved["state"])
    chex.assert_trees_all_equal(again["state"], saved["state"])
    assert again["param_groups"] == saved["param_groups"]


@pytest.mark.parametrize("ours_cls", [Adam, Adamax, NAdam, RAdam])
def test_no_state_before_the_first_step_and_state_keys_after(ours_cls):
    ours = GivenGradients(initial())
    optimizer = ours_cls(ours.ordered)
    assert optimizer.state_dict()["state"] == {}
    make_step(ours.model, optimizer)(gradients(1)[0])
    keys = {
        Adam: ["exp_avg", "exp_avg_sq", "step"],
        Adamax: ["exp_avg", "exp_inf", "step"],
        NAdam: ["exp_avg", "exp_avg_sq", "mu_product", "step"],
        RAdam: ["exp_avg", "exp_avg_sq", "step"],
    }[ours_cls]
    for entry in optimizer.state_dict()["state"].values():
        assert sorted(entry) == keys
        assert entry["step"] == 1.0


def test_learning_rate_and_weight_decay_change_without_recompiling():
    init, grads = initial(), gradients(6)
    ours = GivenGradients(init)
    optimizer = NAdam(ours.ordered, lr=1e-2, weight_decay=0.1)
    step = make_step(ours.model, optimizer)
    theirs = torch_params(init)
    torch_optimizer = torch.optim.NAdam(list(theirs.values()), lr=1e-2, weight_decay=0.1)
    for i, g in enumerate(grads):
        for opt in (optimizer, torch_optimizer):
            opt.param_groups[0]["lr"] = 1e-2 / (i + 1)
            opt.param_groups[0]["weight_decay"] = 0.1 * i
        step(g)
        torch_step(torch_optimizer, theirs, g)
    assert step.num_compiles == 1
    assert max_param_error(ours, theirs) <= TOLERANCE


def test_momentum_decay_is_part_of_the_compiled_step():
    ours = GivenGradients(initial())
    optimizer = NAdam(ours.ordered)
    make_step(ours.model, optimizer)(gradients(1)[0])
    with pytest.raises(cstorch.StateError, match="part of the compiled step"):
        optimizer.param_groups[0]["momentum_decay"] = 0.1


def test_loading_state_with_different_steps_per_parameter_is_refused():
    init, grads = initial(), gradients(2)
    theirs = torch_params(init)
    torch_optimizer = torch.optim.NAdam(list(theirs.values()))
    torch_step(torch_optimizer, theirs, grads[0])
    theirs["a.bias"].grad = None
    theirs["a.weight"].grad = torch.tensor(grads[1]["a.weight"])
    theirs["b.weight"].grad = torch.tensor(grads[1]["b.weight"])
    torch_optimizer.step()
    optimizer = NAdam(GivenGradients(init).ordered)
    with pytest.raises(cstorch.ConfigError, match="different 'step' values per parameter"):
        optimizer.load_state_dict(torch_optimizer.state_dict())


def test_loading_state_without_amsgrad_buffers_into_amsgrad_is_refused():
    init, grads = initial(), gradients(1)
    theirs = torch_params(init)
    torch_optimizer = torch.optim.Adam(list(theirs.values()))
    torch_step(torch_optimizer, theirs, grads[0])
    optimizer = Adam(GivenGradients(init).ordered, amsgrad=True)
    with pytest.raises(cstorch.StateError, match="'max_exp_avg_sq'"):
        optimizer.load_state_dict(torch_optimizer.state_dict())


INVALID = [
    (Adam, {"lr": -1.0}),
    (Adam, {"eps": -1.0}),
    (Adam, {"betas": (1.0, 0.9)}),
    (Adam, {"betas": (0.9, -0.1)}),
    (Adam, {"weight_decay": -0.1}),
    (Adamax, {"lr": -1e-3}),
    (Adamax, {"betas": (0.9, 1.5)}),
    (Adamax, {"eps": -1e-8}),
    (NAdam, {"weight_decay": -1.0}),
    (NAdam, {"momentum_decay": -4e-3}),
    (NAdam, {"betas": (-0.5, 0.999)}),
    (RAdam, {"lr": -0.5}),
    (RAdam, {"betas": (0.9, 1.0)}),
    (RAdam, {"eps": -1.0}),
]


@pytest.mark.parametrize(
    "ours_cls, kwargs",
    INVALID,
    ids=[f"{c.__name__}-{next(iter(k))}-{i}" for i, (c, k) in enumerate(INVALID)],
)
def test_invalid_hyperparameters_raise_torchs_message(ours_cls, kwargs):
    with pytest.raises(ValueError) as want:
        getattr(torch.optim, ours_cls.__name__)([torch.nn.Parameter(torch.ones(2))], **kwargs)
    ours = GivenGradients(initial())
    with pytest.raises(cstorch.ConfigError) as got:
        ours_cls(ours.ordered, **kwargs)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("ours_cls", [Adam, Adamax, NAdam, RAdam])
def test_differentiable_is_refused_and_other_flags_are_ignored(ours_cls):
    ours = GivenGradients(initial())
    with pytest.raises(cstorch.ConfigError, match="differentiable=True"):
        ours_cls(ours.ordered, differentiable=True)
    flags = {"foreach": True, "capturable": True}
    if ours_cls is Adam:
        flags["fused"] = True
    ours_cls(ours.ordered, **flags)


# ---- the pure optax factories ----------------------------------------------------------

FACTORIES = [
    (transforms.adam, "Adam", {"lr": 1e-2, "weight_decay": 0.1}),
    (transforms.adamax, "Adamax", {"lr": 1e-2, "weight_decay": 0.1}),
    (transforms.nadam, "NAdam", {"lr": 1e-2, "decoupled_weight_decay": True, "weight_decay": 0.1}),
    (transforms.radam, "RAdam", {"lr": 1e-2, "weight_decay": 0.1}),
]


def _factory_kwargs(kwargs):
    out = {k: v for k, v in kwargs.items() if k != "lr"}
    out["learning_rate"] = kwargs["lr"]
    return out


@pytest.mark.parametrize("factory, torch_name, kwargs", FACTORIES, ids=[f[1] for f in FACTORIES])
def test_factory_under_jit_matches_torch(factory, torch_name, kwargs):
    init, grads = initial(), gradients(20)
    tx = factory(**_factory_kwargs(kwargs))
    params = {k: jnp.asarray(v) for k, v in init.items()}
    state = tx.init(params)

    @jax.jit
    @chex.assert_max_traces(n=1)  # 20 updates, one trace: the state keeps its dtypes
    def update(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    theirs = torch_params(init)
    torch_optimizer = getattr(torch.optim, torch_name)(list(theirs.values()), **kwargs)
    for g in grads:
        params, state = update(params, state, g)
        torch_step(torch_optimizer, theirs, g)
    chex.assert_trees_all_close(params, {k: p.detach().numpy() for k, p in theirs.items()},
                                rtol=TOLERANCE, atol=0)
    assert state[2].count.dtype == jnp.int32


@pytest.mark.parametrize("factory, torch_name, kwargs", FACTORIES, ids=[f[1] for f in FACTORIES])
def test_factory_init_works_on_shape_dtype_structs(factory, torch_name, kwargs):
    del torch_name
    tx = factory(**_factory_kwargs(kwargs))
    shapes = {"w": jax.ShapeDtypeStruct((3, 2), jnp.float32)}
    state = jax.eval_shape(tx.init, shapes)
    leaves = jax.tree.leaves(state)
    assert all(leaf.dtype in (jnp.float32, jnp.int32) for leaf in leaves)


@pytest.mark.parametrize(
    "factory, want",
    [
        (transforms.adam, 0.999),
        (transforms.adamax, 0.998),
        (transforms.nadam, 0.997887),
        (transforms.radam, 0.999),
    ],
)
def test_docstring_examples(factory, want):
    tx = factory()
    params = {"w": jnp.ones(2)}
    updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
    np.testing.assert_allclose(optax.apply_updates(params, updates)["w"], [want, want], rtol=1e-6)


def test_radam_needs_a_static_beta2():
    @jax.jit
    def build(b2):
        return transforms.radam(1e-3, 0.9, b2)

    with pytest.raises(cstorch.ConfigError, match="b2 must be a Python number"):
        build(0.999)


def test_giant_step_counts_do_not_overflow():
    tx = transforms.nadam()
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    state = (
        state[0],
        state[1],
        state[2]._replace(count=jnp.asarray(jnp.iinfo(jnp.int32).max - 1, jnp.int32)),
        *state[3:],
    )
    for _ in range(3):
        updates, state = tx.update({"w": jnp.ones(2)}, state, params)
    assert int(state[2].count) == jnp.iinfo(jnp.int32).max
    assert bool(jnp.all(jnp.isfinite(updates["w"])))
