"""An optimizer's initial state is made on the host where it is constant (zero moments, a
step count, a fill value): the same arrays, bit for bit and dtype for dtype, as the
program that runs the optax ``init`` functions would make, and no program compiled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from cstorch_defaults import CSTORCH_DEFAULTS, REQUIRED

import cerebrax as cstorch
from cerebrax._step import constant_on_host


def _params() -> list[list]:
    """Two groups: float32 weights and bfloat16 ones, of several shapes."""
    rng = np.random.default_rng(0)
    f32 = [cstorch.Parameter(rng.normal(size=s).astype(np.float32), name=f"f{i}")
           for i, s in enumerate([(5, 3), (3,), (2, 3, 4)])]
    bf16 = [cstorch.Parameter(rng.normal(size=s).astype(ml_dtypes.bfloat16), name=f"b{i}")
            for i, s in enumerate([(4, 2), (7,)])]
    return [f32, bf16]


def _assert_identical(ours, want) -> None:
    ours_leaves, ours_def = jax.tree.flatten(ours)
    want_leaves, want_def = jax.tree.flatten(want)
    assert ours_def == want_def
    for a, b in zip(ours_leaves, want_leaves, strict=True):
        assert isinstance(a, jax.Array) and not a.weak_type
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), strict=True)


@pytest.mark.parametrize("name", sorted(CSTORCH_DEFAULTS))
def test_every_optimizer_starts_from_the_state_its_init_program_makes(name):
    kwargs = {k: (0.1 if v is REQUIRED else v) for k, v in CSTORCH_DEFAULTS[name].items()
              if k == "lr" or v is REQUIRED}
    groups = _params()
    optimizer = getattr(cstorch.optim, name)(
        [{"params": groups[0]}, {"params": groups[1], "lr": 0.25}], **kwargs)
    inits = [optimizer._transform(group).init for group in optimizer.param_groups]
    values = [[p.stored for p in group] for group in groups]
    want = jax.jit(lambda v: [init(x) for init, x in zip(inits, v)])(values)
    _assert_identical(optimizer._tx_state.stored, want)


def test_zeros_fills_and_counts_are_made_on_the_host():
    values = [jnp.ones((3, 2)), jnp.ones((4,), jnp.bfloat16)]

    def init(params):
        return (jnp.zeros((), jnp.int32),
                jax.tree.map(jnp.zeros_like, params),
                jax.tree.map(lambda p: jnp.full_like(p, 0.01), params),
                jnp.asarray(3, jnp.int32).astype(jnp.float32))

    out = constant_on_host(init, values)
    assert out is not None
    for leaf in jax.tree.leaves(out):
        assert isinstance(leaf, np.ndarray) and leaf.flags.writeable and leaf.flags.owndata
    _assert_identical(jax.tree.map(jnp.asarray, out), jax.jit(init)(values))


@pytest.mark.parametrize("init, on_host", [
    (lambda params: jax.tree.map(lambda p: p * 2, params), False),  # reads the values
    (lambda params: jax.tree.map(jnp.copy, params), False),  # a copy of the values
    (lambda params: optax.ema(0.9).init(params), True),  # zeros and a count: constants
    # A cast that rounds (0.1 has no exact bfloat16): XLA's rounding, not numpy's.
    (lambda params: jnp.full_like(params[0], 0.1).astype(jnp.bfloat16), False),
    (lambda params: jnp.arange(4.0), False),  # an operation without a host rule
])
def test_only_constants_are_made_on_the_host(init, on_host):
    values = [jnp.ones((3, 2))]
    out = constant_on_host(init, values)
    assert (out is not None) == on_host
    if on_host:
        _assert_identical(jax.tree.map(jnp.asarray, out), jax.jit(init)(values))


def test_state_for_an_accelerator_is_left_to_the_program(monkeypatch):
    # On a GPU or TPU the program makes the zeros in device memory; made on the host,
    # every moment would be copied over.
    values = [jnp.ones((3, 2))]
    init = optax.adam(0.1).init
    assert constant_on_host(init, values) is not None
    gpu = type("Device", (), {"platform": "gpu"})()
    monkeypatch.setattr(type(values[0]), "devices", lambda self: {gpu})
    assert constant_on_host(init, values) is None
