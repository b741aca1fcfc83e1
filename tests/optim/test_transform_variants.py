"""Every optax factory of ``cerebrax.optim.transforms`` with and without jit (chex variants).

The optimizers that torch.optim has are compared with torch.optim on the same parameters
and gradients (see optim_harness); Lamb and Lion, which torch does not have, and the
``scale_by_*`` building blocks are compared with their own update run eagerly, outside
any transformation. Each variant also keeps the state's structure and dtypes.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
import pytest
from absl.testing import parameterized

from cerebrax.optim import transforms

torch = pytest.importorskip("torch")
from optim_harness import gradients, initial, torch_params, torch_step  # noqa: E402

STEPS = 10

# (id, factory, its arguments, torch.optim class name, the torch arguments)
_VS_TORCH = [
    ("sgd", transforms.sgd, dict(learning_rate=0.1), "SGD", dict(lr=0.1)),
    ("sgd_nesterov_wd", transforms.sgd,
     dict(learning_rate=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2),
     "SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2)),
    ("sgd_dampening_maximize", transforms.sgd,
     dict(learning_rate=0.05, momentum=0.5, dampening=0.3, maximize=True),
     "SGD", dict(lr=0.05, momentum=0.5, dampening=0.3, maximize=True)),
    ("adam_amsgrad_l2", transforms.adam,
     dict(learning_rate=1e-2, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.1, amsgrad=True),
     "Adam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, amsgrad=True)),
    ("adam_decoupled", transforms.adam,
     dict(learning_rate=3e-3, weight_decay=0.05, decoupled_weight_decay=True),
     "Adam", dict(lr=3e-3, weight_decay=0.05, decoupled_weight_decay=True)),
    ("adamw", transforms.adamw, dict(learning_rate=1e-2, weight_decay=0.05),
     "AdamW", dict(lr=1e-2, weight_decay=0.05)),
    ("adamw_maximize", transforms.adamw,
     dict(learning_rate=1e-3, weight_decay=0.0, maximize=True),
     "AdamW", dict(lr=1e-3, weight_decay=0.0, maximize=True)),
    ("adamax", transforms.adamax, dict(learning_rate=1e-2, weight_decay=0.1),
     "Adamax", dict(lr=1e-2, weight_decay=0.1)),
    ("nadam", transforms.nadam,
     dict(learning_rate=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
     "NAdam", dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)),
    ("radam", transforms.radam, dict(learning_rate=1e-2, weight_decay=0.1),
     "RAdam", dict(lr=1e-2, weight_decay=0.1)),
    ("adagrad", transforms.adagrad,
     dict(learning_rate=0.1, lr_decay=0.01, initial_accumulator_value=0.1),
     "Adagrad", dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
    ("adadelta", transforms.adadelta, dict(learning_rate=1.0, rho=0.9, weight_decay=0.01),
     "Adadelta", dict(lr=1.0, rho=0.9, weight_decay=0.01)),
    ("asgd", transforms.asgd, dict(learning_rate=0.05, t0=2), "ASGD", dict(lr=0.05, t0=2)),
    ("rmsprop_centered_momentum", transforms.rmsprop,
     dict(learning_rate=0.01, momentum=0.9, centered=True),
     "RMSprop", dict(lr=0.01, momentum=0.9, centered=True)),
    ("rprop", transforms.rprop, dict(learning_rate=0.01), "Rprop", dict(lr=0.01)),
    ("adafactor", transforms.adafactor, dict(learning_rate=1e-2, weight_decay=0.1),
     "Adafactor", dict(lr=1e-2, weight_decay=0.1)),
]

# (id, factory, its arguments): no torch counterpart
_EAGER_REFERENCE = [
    ("lamb", transforms.lamb, dict(learning_rate=1e-2, weight_decay=0.1)),
    ("lamb_adam_maximize", transforms.lamb, dict(learning_rate=1e-2, adam=True, maximize=True)),
    ("lion", transforms.lion, dict(learning_rate=1e-3, weight_decay=0.1)),
    ("lion_maximize", transforms.lion, dict(learning_rate=1e-2, b1=0.8, b2=0.95, maximize=True)),
    ("scale_by_torch_momentum", transforms.scale_by_torch_momentum,
     dict(momentum=0.9, dampening=0.1, nesterov=True)),
    ("scale_by_torch_adam", transforms.scale_by_torch_adam, dict(amsgrad=True)),
    ("scale_by_torch_adamax", transforms.scale_by_torch_adamax, {}),
    ("scale_by_torch_nadam", transforms.scale_by_torch_nadam, {}),
    ("scale_by_torch_radam", transforms.scale_by_torch_radam, {}),
    ("scale_by_torch_adagrad", transforms.scale_by_torch_adagrad, dict(lr_decay=0.01)),
    ("scale_by_torch_adadelta", transforms.scale_by_torch_adadelta, {}),
    ("scale_by_torch_asgd", transforms.scale_by_torch_asgd, dict(learning_rate=0.05, t0=2)),
    ("scale_by_torch_rmsprop", transforms.scale_by_torch_rmsprop,
     dict(momentum=0.5, centered=True)),
    ("scale_by_torch_rprop", transforms.scale_by_torch_rprop, dict(learning_rate=0.01)),
    ("scale_by_torch_factored_rms", transforms.scale_by_torch_factored_rms, {}),
    ("scale_by_relative_step", transforms.scale_by_relative_step, {}),
    ("scale_by_lamb_moments", transforms.scale_by_lamb_moments, {}),
    ("scale_by_clamped_trust_ratio", transforms.scale_by_clamped_trust_ratio, {}),
    ("scale_by_lion_sign", transforms.scale_by_lion_sign, {}),
    ("add_decoupled_weight_decay", transforms.add_decoupled_weight_decay,
     dict(learning_rate=1e-2, weight_decay=0.1)),
    ("muon", transforms.muon, dict(learning_rate=0.02, weight_decay=0.1)),
    # Unit-size steps (no learning rate): each Newton-Schulz iteration (slope 3.4 near 0)
    # amplifies jit-vs-eager fusion rounding; the muon row above runs ns_steps=5 with a rate.
    ("scale_by_muon", transforms.scale_by_muon, dict(momentum=0.9, nesterov=False, ns_steps=3)),
]


def _apply(tx: optax.GradientTransformation):
    """One optimizer step as a pure function: (params, state, grads) -> (params, state)."""

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


def _structure_and_dtypes(tree):
    return jax.tree.structure(tree), [leaf.dtype for leaf in jax.tree.leaves(tree)]


class TransformVariantsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*_VS_TORCH)
    def test_update_matches_torch(self, factory, kwargs, torch_name, torch_kwargs):
        init, grads = initial(), gradients(STEPS)
        tx = factory(**kwargs)
        params = {k: jnp.asarray(v) for k, v in init.items()}
        state = tx.init(params)
        step = self.variant(_apply(tx))
        theirs = torch_params(init)
        torch_optimizer = getattr(torch.optim, torch_name)(list(theirs.values()), **torch_kwargs)
        for g in grads:
            params, new_state = step(params, state, g)
            assert _structure_and_dtypes(new_state) == _structure_and_dtypes(state)
            state = new_state
            torch_step(torch_optimizer, theirs, g)
        chex.assert_trees_all_close(
            params, {k: p.detach().numpy() for k, p in theirs.items()}, rtol=1e-5, atol=1e-7)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*_EAGER_REFERENCE)
    def test_update_matches_the_eager_update(self, factory, kwargs):
        init, grads = initial(), gradients(STEPS)
        tx = factory(**kwargs)
        params = {k: jnp.asarray(v) for k, v in init.items()}
        ours, reference = (params, tx.init(params)), (params, tx.init(params))
        step = self.variant(_apply(tx))
        for g in grads:
            g = {k: jnp.asarray(v) for k, v in g.items()}
            ours = step(*ours, g)
            reference = _apply(tx)(*reference, g)
            assert _structure_and_dtypes(ours[1]) == _structure_and_dtypes(reference[1])
        # Parameters are O(1): 1e-6 is a few float32 ulps of them after ten steps.
        chex.assert_trees_all_close(ours, reference, rtol=1e-6, atol=1e-6)


def test_every_factory_is_covered():
    """A new factory in cerebrax.optim.transforms needs a row in one of the tables above."""
    factories = {name for name, value in vars(transforms).items()
                 if not name.startswith("_") and callable(value) and not isinstance(value, type)}
    covered = {row[1].__name__ for row in _VS_TORCH + _EAGER_REFERENCE}
    assert covered == factories
