"""``amp.autocast``, ``enable_mixed_precision`` and ``get_floating_point_dtype(_str)``.

What a model computes in is seen from inside its apply function (the dtypes of its
weights and inputs), and its output is compared with the same computation done in
that dtype by hand.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import cerebrax as cstorch


def _model(backend="CPU"):
    seen = []

    def apply(params, x):
        seen.append((params["w"].dtype, x.dtype))
        return x @ params["w"]

    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3) / 3
    model = cstorch.compile(cstorch.FunctionalModel(apply, {"w": jnp.asarray(w)}), backend)
    return model, w, seen


def _x():
    return np.linspace(0.1, 2.3, 8, dtype=np.float32).reshape(2, 4)


def test_ops_under_autocast_run_in_the_half_dtype_and_outside_in_float32():
    model, w, seen = _model()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        with cstorch.amp.autocast():
            half = model(x).sum()
        full = model(x).sum()
        cstorch.backward(half + full)
        optimizer.step()
        return half, full

    half, full = step(_x())
    assert seen == [(jnp.float16, jnp.float16), (jnp.float32, jnp.float32)]
    want_half = (_x().astype(np.float16) @ w.astype(np.float16)).astype(np.float32).sum()
    np.testing.assert_allclose(float(half), want_half, rtol=2e-3)
    np.testing.assert_allclose(float(full), float((_x() @ w).sum()), rtol=1e-6)
    assert half.dtype == jnp.float32  # outputs come back in float32


def _in(dtype, w):
    """The model's output computed by hand with weights and inputs in ``dtype``."""
    x = jnp.asarray(_x(), dtype)
    return np.asarray((x @ jnp.asarray(w, dtype)).astype(jnp.float32))


@pytest.mark.parametrize("dtype, expected", [("bfloat16", jnp.bfloat16),
                                             (jnp.float16, jnp.float16)])
def test_autocast_takes_a_dtype_and_nests(dtype, expected):
    model, w, seen = _model()
    outs = []
    with cstorch.amp.autocast(dtype):
        outs.append(model(_x()))
        with cstorch.amp.autocast(enabled=False):
            outs.append(model(_x()))
        outs.append(model(_x()))
    outs.append(model(_x()))
    assert {s[0] for s in seen} == {jnp.dtype(expected), jnp.dtype(jnp.float32)}
    outs = [np.asarray(o) for o in outs]
    np.testing.assert_allclose(outs[0], _in(expected, w), rtol=1e-2, atol=1e-3)
    np.testing.assert_array_equal(outs[1], _in(jnp.float32, w))
    np.testing.assert_array_equal(outs[2], outs[0])  # under autocast again: half
    np.testing.assert_array_equal(outs[3], outs[1])  # outside: float32
    assert not np.array_equal(outs[0], outs[1])


def test_autocast_disabled_computes_in_float32_on_csx():
    model, _, seen = _model("CSX")
    model(_x())
    with cstorch.amp.autocast(enabled=False):
        model(_x())
    assert [s[0] for s in seen] == [jnp.float16, jnp.float32]


def test_autocast_as_a_decorator():
    model, _, seen = _model()

    @cstorch.amp.autocast("bfloat16")
    def forward(x):
        return model(x)

    forward(_x())
    model(_x())
    assert [s[0] for s in seen] == [jnp.bfloat16, jnp.float32]


def test_enable_mixed_precision_turns_the_policy_on_and_off():
    model, _, seen = _model()
    assert cstorch.amp.get_floating_point_dtype() == jnp.float32
    assert cstorch.amp.get_floating_point_dtype_str() == "float32"
    assert cstorch.amp.enable_mixed_precision() is True
    assert cstorch.amp.mixed_precision()
    assert cstorch.amp.get_floating_point_dtype() == jnp.float16
    model(_x())
    cstorch.amp.set_half_dtype("bfloat16")
    assert cstorch.amp.get_floating_point_dtype_str() == "bfloat16"
    model(_x())
    assert cstorch.amp.enable_mixed_precision(False) is False
    assert cstorch.amp.get_floating_point_dtype_str("fp32") == "fp32"
    assert cstorch.amp.get_half_dtype_str() == "bfloat16"  # the choice is kept
    model(_x())
    assert [s[0] for s in seen] == [jnp.float16, jnp.bfloat16, jnp.float32]


def test_bad_arguments_are_refused():
    with pytest.raises(cstorch.ConfigError, match="autocast.*int8"):
        cstorch.amp.autocast("int8")
    with pytest.raises(cstorch.ConfigError, match="enable_mixed_precision.*bool"):
        cstorch.amp.enable_mixed_precision("yes")
