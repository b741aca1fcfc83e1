"""Lamb, Lion and Adafactor: parameters, torch-layout state and errors.

Lamb and Lion have no torch.optim counterpart; they are compared with a float64 NumPy
transcription of the update rule below. Adafactor is compared with torch.optim.Adafactor.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import rel_err

import cerebrax as cstorch
from cerebrax.optim import Adafactor, Lamb, Lion
from cerebrax.optim.transforms._adafactor import adafactor
from cerebrax.optim.transforms._lamb_lion import lamb, lion

torch = pytest.importorskip("torch")
from optim_harness import (  # noqa: E402
    SHAPES,
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
TOL = 1e-5
NAMES = list(SHAPES)
TWO_GROUPS = [(["a.weight", "a.bias"], {"lr": 3e-2, "weight_decay": 0.0}), (["b.weight"], {})]


# ---- float64 references -----------------------------------------------------------------
def _lamb_update(p, g, s, h):
    b1, b2 = h["betas"]
    s["exp_avg"] = b1 * s["exp_avg"] + (1 - b1) * g
    s["exp_avg_sq"] = b2 * s["exp_avg_sq"] + (1 - b2) * g * g
    r = s["exp_avg"] / (np.sqrt(s["exp_avg_sq"]) + h["eps"]) + h["weight_decay"] * p
    w, r_norm = min(np.linalg.norm(p), 10.0), np.linalg.norm(r)
    trust = w / r_norm if w > 0 and r_norm > 0 and not h["adam"] else 1.0
    return p - h["lr"] * trust * r


def _lion_update(p, g, s, h):
    b1, b2 = h["betas"]
    direction = np.sign(b1 * s["exp_avg"] + (1 - b1) * g)
    s["exp_avg"] = b2 * s["exp_avg"] + (1 - b2) * g
    return p * (1 - h["lr"] * h["weight_decay"]) - h["lr"] * direction


_REFERENCES = {
    "Lamb": (_lamb_update, ("exp_avg", "exp_avg_sq"),
             dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, adam=False,
                  maximize=False)),
    "Lion": (_lion_update, ("exp_avg",),
             dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, maximize=False)),
}


def reference(cls_name, init, grads, kwargs, groups):
    """Parameters and per-name state after ``grads``, in float64."""
    update, state_names, defaults = _REFERENCES[cls_name]
    hparams = {n: {**defaults, **kwargs, **over} for names, over in groups for n in names}
    params = {k: v.astype(np.float64) for k, v in init.items()}
    state = {k: {s: np.zeros_like(params[k]) for s in state_names} for k in params}
    for g in grads:
        for k, h in hparams.items():
            gk = -g[k].astype(np.float64) if h["maximize"] else g[k].astype(np.float64)
            params[k] = update(params[k], gk, state[k], h)
    return params, state


# ---- Lamb and Lion against the reference -------------------------------------------------
def _scaled(factor):
    return lambda init: {k: v * factor for k, v in init.items()}


def _zero_bias(init):
    return {**init, "a.bias": np.zeros_like(init["a.bias"])}


# (id, class, kwargs, param groups or None, change of the initial parameters or None)
_REFERENCE_CASES = [
    ("lamb-defaults", "Lamb", {}, None, None),
    ("lamb-custom", "Lamb", {"lr": 2e-2, "betas": (0.8, 0.99), "eps": 1e-8,
                             "weight_decay": 0.1}, None, None),
    ("lamb-adam-maximize", "Lamb", {"lr": 1e-2, "adam": True, "maximize": True,
                                    "weight_decay": 0.01}, None, None),
    ("lamb-clamped-norm", "Lamb", {"lr": 1e-2}, None, _scaled(5.0)),
    ("lamb-zero-weight", "Lamb", {"lr": 1e-2, "weight_decay": 0.1}, None, _zero_bias),
    ("lamb-two-groups", "Lamb", {"lr": 1e-2, "weight_decay": 0.05}, TWO_GROUPS, None),
    ("lion-defaults", "Lion", {}, None, None),
    ("lion-custom", "Lion", {"lr": 1e-2, "betas": (0.8, 0.95), "weight_decay": 0.5},
     None, None),
    ("lion-maximize", "Lion", {"lr": 3e-3, "maximize": True, "weight_decay": 0.1},
     None, None),
    ("lion-two-groups", "Lion", {"lr": 1e-3, "weight_decay": 0.1},
     [(["a.weight", "a.bias"], {"lr": 1e-2, "weight_decay": 1.0}), (["b.weight"], {})], None),
]
_CLASSES = {"Lamb": Lamb, "Lion": Lion}


def _group_dicts(params, groups):
    return [{"params": [params[n] for n in names], **over} for names, over in groups]


@pytest.mark.parametrize("name, cls, kwargs, groups, change", _REFERENCE_CASES,
                         ids=[c[0] for c in _REFERENCE_CASES])
def test_lamb_lion_match_reference_over_50_steps(name, cls, kwargs, groups, change):
    init, grads = initial(), gradients(STEPS)
    if change is not None:
        init = change(init)
    groups = groups or [(NAMES, {})]
    ours = GivenGradients(init)
    optimizer = _CLASSES[cls](_group_dicts(ours.params, groups), **kwargs)
    step = make_step(ours.model, optimizer)
    for g in grads:
        step(g)
    want_params, want_state = reference(cls, init, grads, kwargs, groups)
    got = ours.state()
    for k in NAMES:
        assert rel_err(got[k], want_params[k]) <= TOL, k
    order = [n for names, _ in groups for n in names]
    state = optimizer.state_dict()["state"]
    for i, k in enumerate(order):
        assert sorted(state[i]) == sorted(want_state[k])
        for key, value in want_state[k].items():
            assert rel_err(state[i][key], value) <= TOL, (k, key)
    assert step.num_compiles == 1


@pytest.mark.parametrize("cls, kwargs", [("Lamb", {"lr": 1e-2, "weight_decay": 0.1}),
                                         ("Lion", {"lr": 1e-2, "weight_decay": 0.1})])
def test_lamb_lion_state_dict_round_trip(cls, kwargs):
    init, grads = initial(), gradients(STEPS)
    straight = GivenGradients(init)
    optimizer = _CLASSES[cls](straight.ordered, **kwargs)
    step = make_step(straight.model, optimizer)
    for g in grads[:25]:
        step(g)
    saved, saved_params = optimizer.state_dict(), straight.state()
    for g in grads[25:]:
        step(g)

    resumed = GivenGradients(init)
    resumed.model.load_state_dict(saved_params)
    fresh = _CLASSES[cls](resumed.ordered, **kwargs)
    fresh.load_state_dict(saved)
    resumed_step = make_step(resumed.model, fresh)
    for g in grads[25:]:
        resumed_step(g)
    for k in NAMES:
        assert rel_err(resumed.state()[k], straight.state()[k]) <= 1e-7, k


def test_lamb_lion_state_exists_before_the_first_step():
    ours = GivenGradients(initial())
    state = Lamb(ours.ordered).state_dict()["state"]
    assert sorted(state) == [0, 1, 2]
    assert sorted(state[0]) == ["exp_avg", "exp_avg_sq"]
    assert state[0]["exp_avg"].shape == SHAPES["a.weight"]
    assert not np.any(state[0]["exp_avg"])
    assert sorted(Lion(ours.ordered).state_dict()["state"][2]) == ["exp_avg"]


# ---- Adafactor against torch.optim.Adafactor ----------------------------------------------
def test_adafactor_cstorch_aliases_match_torch_names():
    def ours_cls(params):
        return Adafactor(params, lr=3e-2, decay_rate=-0.6, clip_threshold=2.0, beta1=None,
                         scale_parameter=True, warmup_init=False)

    def torch_cls(params):
        return torch.optim.Adafactor(params, lr=3e-2, beta2_decay=-0.6, d=2.0)

    (ours, optimizer, _), (theirs, torch_optimizer) = run_both(ours_cls, torch_cls, {}, 20)
    assert max_param_error(ours, theirs) <= TOL
    assert optimizer.param_groups[0]["beta2_decay"] == pytest.approx(-0.6)
    assert optimizer.param_groups[0]["d"] == pytest.approx(2.0)


def _to_torch(state_dict):
    state = {i: {k: torch.tensor(np.asarray(v)) for k, v in entry.items()}
             for i, entry in state_dict["state"].items()}
    return {"state": state, "param_groups": state_dict["param_groups"]}


def test_adafactor_state_dict_moves_between_torch_and_cerebrax():
    kwargs = {"lr": 2e-2, "weight_decay": 0.1}
    init, grads = initial(), gradients(STEPS)
    tparams = torch_params(init)
    topt = torch.optim.Adafactor(list(tparams.values()), **kwargs)
    for g in grads[:20]:
        torch_step(topt, tparams, g)
    # torch -> cerebrax, mid-run.
    ours = GivenGradients(init)
    ours.model.load_state_dict({k: v.detach() for k, v in tparams.items()})
    optimizer = Adafactor(ours.ordered, **kwargs)
    optimizer.load_state_dict(topt.state_dict())
    step = make_step(ours.model, optimizer)
    for g in grads[20:35]:
        step(g)
        torch_step(topt, tparams, g)
    assert max_param_error(ours, tparams) <= TOL
    assert max_state_error(optimizer, topt) <= TOL
    # cerebrax -> torch, mid-run.
    tparams2 = torch_params({k: np.asarray(ours.state()[k]) for k in SHAPES})
    topt2 = torch.optim.Adafactor(list(tparams2.values()), **kwargs)
    topt2.load_state_dict(_to_torch(optimizer.state_dict()))
    for g in grads[35:]:
        step(g)
        torch_step(topt2, tparams2, g)
    assert max_param_error(ours, tparams2) <= TOL
    assert max_state_error(optimizer, topt2) <= TOL


def test_adafactor_state_before_the_first_step_is_empty_like_torch():
    ours = GivenGradients(initial())
    assert Adafactor(ours.ordered, lr=1e-2).state_dict()["state"] == {}


def test_adafactor_factors_leading_dimensions_like_torch():
    """3-D, 0-D and 1-D parameters through the pure transformation, under jit."""
    rng = np.random.default_rng(3)
    shapes = {"cube": (2, 3, 4), "scalar": (), "vector": (4,)}
    init = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    tx = adafactor(3e-2, weight_decay=0.01)
    params = {k: jnp.asarray(v) for k, v in init.items()}
    state = tx.init(params)
    update = jax.jit(tx.update)
    tparams = torch_params(init)
    topt = torch.optim.Adafactor(list(tparams.values()), lr=3e-2, weight_decay=0.01)
    for _ in range(20):
        grads = {k: (rng.normal(size=s) * 10.0 ** rng.uniform(-3, 0)).astype(np.float32)
                 for k, s in shapes.items()}
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        torch_step(topt, tparams, grads)
    for k, p in tparams.items():
        assert rel_err(params[k], p.detach().numpy()) <= TOL, k
    factored = state[1]
    want = topt.state_dict()["state"][0]
    assert rel_err(factored.row_var["cube"], want["row_var"].numpy()) <= TOL
    assert rel_err(factored.col_var["cube"], want["col_var"].numpy()) <= TOL


# ---- pure transformations ---------------------------------------------------------------
_TRANSFORMS = [
    ("lamb", lambda: lamb(1e-2, weight_decay=0.1)),
    ("lion", lambda: lion(1e-3, weight_decay=0.1)),
    ("adafactor", lambda: adafactor(1e-2, weight_decay=0.1)),
]


@pytest.mark.parametrize("name, make", _TRANSFORMS, ids=[t[0] for t in _TRANSFORMS])
def test_transform_invariants(name, make):
    tx = make()
    params = {k: jnp.asarray(v) for k, v in initial().items()}
    abstract = jax.eval_shape(tx.init, jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params))
    state = tx.init(params)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), abstract) == jax.tree.map(
        lambda x: (x.shape, x.dtype), state)
    jitted = jax.jit(chex.assert_max_traces(tx.update, n=1))  # five updates, one trace
    p_jit, p_eager, s_jit, s_eager = params, params, state, state
    for g in gradients(5):
        g = {k: jnp.asarray(v) for k, v in g.items()}
        u, s_jit = jitted(g, s_jit, p_jit)
        p_jit = optax.apply_updates(p_jit, u)
        u, s_eager = tx.update(g, s_eager, p_eager)
        p_eager = optax.apply_updates(p_eager, u)
        assert jax.tree.map(lambda x: (x.shape, x.dtype), s_jit) == jax.tree.map(
            lambda x: (x.shape, x.dtype), state)
    for k in p_jit:
        assert rel_err(p_jit[k], p_eager[k]) <= 1e-6, k


def test_learning_rate_change_needs_no_recompile():
    init, grads = initial(), gradients(6)
    for cls in (Lamb, Lion, Adafactor):
        ours = GivenGradients(init)
        optimizer = cls(ours.ordered, lr=1e-2)
        step = make_step(ours.model, optimizer)
        for i, g in enumerate(grads):
            optimizer.param_groups[0]["lr"] = 1e-2 / (i + 1)
            step(g)
        assert step.num_compiles == 1, cls.__name__
        cstorch.reset()


# ---- errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls, kwargs, match",
    [(Lamb, {"lr": -1.0}, "Invalid learning rate"),
     (Lamb, {"betas": (1.0, 0.9)}, "Invalid beta parameter at index 0"),
     (Lamb, {"eps": -1.0}, "Invalid epsilon"),
     (Lamb, {"weight_decay": -0.1}, "Invalid weight_decay"),
     (Lamb, {"differentiable": True}, "differentiable"),
     (Lion, {"lr": -1.0}, "Invalid learning rate"),
     (Lion, {"betas": (0.9, 1.5)}, "Invalid beta parameter at index 1"),
     (Lion, {"weight_decay": -0.1}, "Invalid weight_decay"),
     (Lion, {"differentiable": True}, "differentiable"),
     (Adafactor, {"lr": -1.0}, "Learning rate should be >= 0"),
     (Adafactor, {"lr": 1e-2, "beta2_decay": 0.5}, "beta2_decay should be <= 0"),
     (Adafactor, {"lr": 1e-2, "eps": (-1.0, 1e-3)}, "epsilon1 should be >= 0"),
     (Adafactor, {"lr": 1e-2, "eps": (None, -1.0)}, "epsilon2 should be >= 0"),
     (Adafactor, {"lr": 1e-2, "d": 0.5}, "Clipping threshold d should be >= 1"),
     (Adafactor, {"lr": 1e-2, "weight_decay": -0.1}, "weight_decay should be >= 0"),
     (Adafactor, {"lr": 1e-2, "differentiable": True}, "differentiable"),
     (Adafactor, {"lr": 1e-2, "beta1": 0.9}, "keeps no first moment"),
     (Adafactor, {"lr": 1e-2, "scale_parameter": False}, "always scales"),
     (Adafactor, {"lr": 1e-2, "relative_step": False}, "min\\(lr, 1 / sqrt\\(t\\)\\)"),
     (Adafactor, {"lr": 1e-2, "relative_step": True}, "Drop relative_step"),
     (Adafactor, {"lr": 1e-2, "warmup_init": True}, "no warm-up"),
     (Adafactor, {"lr": 1e-2, "beta2_decay": -0.5, "decay_rate": -0.6}, "give only beta2_decay"),
     (Adafactor, {"lr": 1e-2, "d": 2.0, "clip_threshold": 3.0}, "give only d")],
)
def test_invalid_hyperparameters(cls, kwargs, match):
    ours = GivenGradients(initial())
    with pytest.raises(cstorch.ConfigError, match=match):
        cls(ours.ordered, **kwargs)


def test_adafactor_transform_refuses_a_schedule():
    with pytest.raises(cstorch.ConfigError, match="inject_hyperparams"):
        adafactor(optax.constant_schedule(1e-2))
    tx = optax.inject_hyperparams(adafactor)(learning_rate=optax.linear_schedule(1e-2, 0.0, 5))
    params = {"w": jnp.ones((3, 2))}
    updates, _ = tx.update({"w": jnp.ones((3, 2))}, tx.init(params), params)
    assert updates["w"].shape == (3, 2)


def test_loading_partial_moments_is_refused():
    ours = GivenGradients(initial())
    optimizer = Lion(ours.ordered)
    state = optimizer.state_dict()
    del state["state"][1]
    with pytest.raises(cstorch.ConfigError, match="only some"):
        optimizer.load_state_dict(state)
