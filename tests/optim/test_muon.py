"""Muon against a float64 NumPy transcription of the published rule.

The reference below is Keller Jordan's Muon as published (and as torch.optim.Muon
documents it): ``buf = mu * buf + g``, the Nesterov blend ``g + mu * buf``, the quintic
Newton-Schulz iteration with (3.4445, -4.7750, 2.0315) on the matrix over its Frobenius
norm (tall matrices transposed), the update scaled by ``sqrt(max(1, rows / cols))`` and
the decoupled weight decay ``p * (1 - lr * wd)``; plus cerebrax's documented choices for
other shapes: 0-D/1-D parameters take the momentum step, higher ones are flattened to
``(shape[0], -1)``.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized
from helpers import rel_err
from optim_harness import SHAPES, GivenGradients, gradients, initial, make_step

import cerebrax as cstorch
from cerebrax.optim.transforms import muon
from cerebrax.optim.transforms._muon import orthogonalize

COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(m: np.ndarray, steps: int) -> np.ndarray:
    a, b, c = COEFFICIENTS
    tall = m.shape[0] > m.shape[1]
    x = m.T if tall else m
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class ReferenceMuon:
    """The published update in float64, one parameter at a time."""

    def __init__(self, params, lr, momentum, weight_decay, nesterov, ns_steps):
        self.params = {k: np.asarray(v, np.float64) for k, v in params.items()}
        self.buf = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.hp = (lr, momentum, weight_decay, nesterov, ns_steps)

    def step(self, grads, lr=None):
        lr0, mu, wd, nesterov, steps = self.hp
        lr = lr0 if lr is None else lr
        for k, p in self.params.items():
            g = np.asarray(grads[k], np.float64)
            self.buf[k] = mu * self.buf[k] + g
            u = g + mu * self.buf[k] if nesterov else self.buf[k]
            if u.ndim >= 2:
                m = u.reshape(u.shape[0], -1)
                o = newton_schulz(m, steps) * max(1.0, m.shape[0] / m.shape[1]) ** 0.5
                u = o.reshape(p.shape)
            self.params[k] = p * (1 - lr * wd) - lr * u


SHAPES_ALL = {"tall": (6, 3), "wide": (3, 7), "square": (4, 4), "filters": (2, 3, 2, 2),
              "bias": (5,), "gain": ()}

SETTINGS = [
    dict(lr=0.02, momentum=0.95, weight_decay=0.01, nesterov=True, ns_steps=5),
    dict(lr=0.05, momentum=0.9, weight_decay=0.0, nesterov=False, ns_steps=5),
    dict(lr=0.01, momentum=0.5, weight_decay=0.1, nesterov=True, ns_steps=3),
    dict(lr=0.03, momentum=0.0, weight_decay=0.05, nesterov=False, ns_steps=8),
]
TOLERANCE = 5e-6  # float32 against float64 after 20 steps (measured: 6e-7 on CPU)


def _draws(shapes, steps, seed):
    rng = np.random.default_rng(seed)
    init = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    grads = [{k: (rng.normal(size=s) * 10.0 ** rng.uniform(-3, 0)).astype(np.float32)
              for k, s in shapes.items()} for _ in range(steps)]
    return init, grads


class MuonRuleTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*SETTINGS)
    def test_transform_matches_the_published_rule(self, **setting):
        init, grads = _draws(SHAPES_ALL, 20, seed=4)
        tx = muon(setting["lr"], setting["momentum"], setting["weight_decay"],
                  nesterov=setting["nesterov"], ns_steps=setting["ns_steps"])
        update = self.variant(tx.update)
        params = {k: jnp.asarray(v) for k, v in init.items()}
        state = tx.init(params)
        reference = ReferenceMuon(init, **setting)
        for g in grads:
            updates, state = update(g, state, params)
            params = optax.apply_updates(params, updates)
            reference.step(g)
        for k in SHAPES_ALL:
            assert params[k].dtype == jnp.float32
            assert rel_err(params[k], reference.params[k]) <= TOLERANCE, k
            assert rel_err(state[0].momentum_buffer[k], reference.buf[k]) <= TOLERANCE, k


def test_orthogonalize_keeps_singular_vectors_and_pushes_values_near_one():
    rng = np.random.default_rng(0)
    for shape in [(8, 3), (3, 8), (5, 5)]:
        m = rng.normal(size=shape) * np.geomspace(1e-2, 1.0, shape[1])  # ill-conditioned
        u, _, vt = np.linalg.svd(m, full_matrices=False)
        o = np.asarray(orthogonalize(jnp.asarray(m, jnp.float32), 5), np.float64)
        core = u.T @ o @ vt.T  # diagonal when o = U S' V^T
        s = np.diag(core)
        assert np.abs(core - np.diag(s)).max() <= 1e-5
        assert 0.6 <= s.min() and s.max() <= 1.25, s
        np.testing.assert_allclose(o, newton_schulz(m, 5), rtol=0, atol=2e-6)


def test_class_matches_the_rule_with_groups_and_a_new_lr_without_recompiling():
    init, grads = initial(), gradients(12)
    ours = GivenGradients(init)
    p = ours.params
    optimizer = cstorch.optim.Muon(
        [{"params": [p["a.weight"], p["a.bias"]], "lr": 0.05, "weight_decay": 0.0},
         {"params": [p["b.weight"]]}])
    step = make_step(ours.model, optimizer)
    first = ReferenceMuon({k: init[k] for k in ("a.weight", "a.bias")},
                          lr=0.05, momentum=0.95, weight_decay=0.0, nesterov=True, ns_steps=5)
    second = ReferenceMuon({"b.weight": init["b.weight"]},
                           lr=0.02, momentum=0.95, weight_decay=0.01, nesterov=True, ns_steps=5)
    for i, g in enumerate(grads):
        if i == 6:
            optimizer.param_groups[1]["lr"] = 0.004
        step(g)
        first.step(g)
        second.step(g, lr=0.004 if i >= 6 else None)
    assert step.num_compiles == 1
    state = ours.state()
    want = {**first.params, **second.params}
    for k in SHAPES:
        assert rel_err(state[k], want[k]) <= TOLERANCE, k
    saved = optimizer.state_dict()
    buffers = {**first.buf, **second.buf}
    for i, k in enumerate(["a.weight", "a.bias", "b.weight"]):
        assert rel_err(saved["state"][i]["momentum_buffer"], buffers[k]) <= TOLERANCE, k
    assert saved["param_groups"][1]["lr"] == 0.004
    assert saved["param_groups"][1]["ns_steps"] == 5 and saved["param_groups"][0]["nesterov"]


def test_save_and_load_continues_the_run(tmp_path):
    init, grads = initial(), gradients(10)
    ours = GivenGradients(init)
    optimizer = cstorch.optim.Muon(ours.ordered, lr=0.03)
    assert optimizer.state_dict()["state"] == {}  # like torch, empty before a step
    step = make_step(ours.model, optimizer)
    for g in grads[:5]:
        step(g)
    cstorch.save({"model": ours.model.state_dict(), "optimizer": optimizer.state_dict()},
                 tmp_path / "muon.h5")
    for g in grads[5:]:
        step(g)
    uninterrupted = ours.state()
    cstorch.reset()
    saved = cstorch.load(tmp_path / "muon.h5")
    resumed = GivenGradients(init)
    resumed.model.load_state_dict(saved["model"])
    optimizer = cstorch.optim.Muon(resumed.ordered, lr=0.03)
    optimizer.load_state_dict(saved["optimizer"])
    step = make_step(resumed.model, optimizer)
    for g in grads[5:]:
        step(g)
    chex.assert_trees_all_equal(resumed.state(), uninterrupted)


def test_configure_optimizer_builds_muon():
    ours = GivenGradients(initial())
    optimizer = cstorch.optim.configure_optimizer("muon", ours.ordered, learning_rate=0.01,
                                                  ns_steps=3)
    assert isinstance(optimizer, cstorch.optim.Muon)
    assert optimizer.param_groups[0]["lr"] == 0.01
    assert optimizer.param_groups[0]["ns_steps"] == 3


@pytest.mark.parametrize("kwargs, match", [({"lr": -1.0}, "Invalid learning rate"),
                                           ({"weight_decay": -0.1}, "Invalid weight_decay"),
                                           ({"momentum": -0.5}, "Invalid momentum"),
                                           ({"ns_steps": 2.5}, "Invalid ns_steps"),
                                           ({"ns_steps": 100}, "Invalid ns_steps")])
def test_invalid_hyperparameters(kwargs, match):
    ours = GivenGradients(initial())
    with pytest.raises(cstorch.ConfigError, match=match):
        cstorch.optim.Muon(ours.ordered, **kwargs)
    with pytest.raises(cstorch.ConfigError, match="matrix"):
        orthogonalize(jnp.ones(3))


def test_init_works_on_abstract_shapes():
    tx = muon()
    abstract = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in SHAPES_ALL.items()}
    state = jax.eval_shape(tx.init, abstract)
    assert {k: v.shape for k, v in state[0].momentum_buffer.items()} == SHAPES_ALL
