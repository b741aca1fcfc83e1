"""cbfloat16 (1 sign, 6 exponent, 9 mantissa bits) is emulated bit-exactly.

The reference enumerates every finite cbfloat16 value from its definition in float64
and rounds to the nearest one, ties to the even mantissa, past the largest one to
infinity; the emulation must give the same float32 bits for every input.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest

import cerebrax as cstorch

MANTISSA = 9
BIAS = 31


def _table() -> np.ndarray:
    """Every non-negative finite cbfloat16 value, ascending; index parity = mantissa parity."""
    m = np.arange(2**MANTISSA, dtype=np.float64)
    subnormals = m * 2.0 ** (1 - BIAS - MANTISSA)
    normals = [(1 + m / 2**MANTISSA) * 2.0 ** (e - BIAS) for e in range(1, 63)]
    return np.concatenate([subnormals, *normals])


TABLE = _table()
MAX = TABLE[-1]
HALF_ULP_AT_MAX = 2.0 ** (31 - MANTISSA - 1)


def _reference(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even onto TABLE, in float64, as float32."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    hi_i = np.clip(np.searchsorted(TABLE, a), 1, len(TABLE) - 1)
    lo, hi = TABLE[hi_i - 1], TABLE[hi_i]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (hi_i % 2 == 0))
    out = np.where(pick_hi, hi, lo)
    out = np.where(a >= TABLE[-1], MAX, out)
    out = np.where(a >= MAX + HALF_ULP_AT_MAX, np.inf, out)
    out = np.where(a == 0, 0.0, out)
    out = np.copysign(out, x)
    return np.where(np.isnan(x), x, out).astype(np.float32)


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    # Random float32 bit patterns whose exponents span subnormals to overflow.
    exponents = rng.integers(127 - 45, 127 + 34, 20000).astype(np.uint32)
    mantissas = rng.integers(0, 2**23, 20000).astype(np.uint32)
    signs = rng.integers(0, 2, 20000).astype(np.uint32)
    random = ((signs << 31) | (exponents << 23) | mantissas).view(np.float32)
    # Exact midpoints between neighbours (the ties), and their float32 neighbours.
    i = rng.integers(0, len(TABLE) - 1, 4000)
    mid = ((TABLE[i] + TABLE[i + 1]) / 2).astype(np.float32)
    near = np.concatenate([mid, np.nextafter(mid, np.float32(0)),
                           np.nextafter(mid, np.float32(np.inf))])
    edges = np.array([0.0, -0.0, 2.0**-30, 2.0**-39, 2.0**-40, 1.5 * 2.0**-39, MAX,
                      MAX + HALF_ULP_AT_MAX, MAX + HALF_ULP_AT_MAX / 2, 2.0**32, 1e38,
                      np.inf, -np.inf, 65504.0, 65520.0, 1e5, 1.0 + 2.0**-10,
                      1.0 + 3 * 2.0**-10, 1e-45], np.float32)
    return np.concatenate([random, near, -near, edges])


class RoundingTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_rounding_is_bit_exact_against_the_float64_enumeration(self):
        x = _inputs()
        got = np.asarray(self.variant(cstorch.amp.round_to_cbfloat16)(jnp.asarray(x)))
        want = _reference(x)
        same = got.view(np.uint32) == want.view(np.uint32)
        bad = np.flatnonzero(~same)
        assert same.all(), [(float(x[j]), float(got[j]), float(want[j])) for j in bad[:5]]


def test_every_cbfloat16_value_is_kept_and_nan_stays_nan():
    values = TABLE.astype(np.float32)
    np.testing.assert_array_equal(np.asarray(cstorch.amp.round_to_cbfloat16(values)),
                                  values)
    assert np.isnan(cstorch.amp.round_to_cbfloat16(np.float32(np.nan)))


def test_range_is_wider_than_float16_and_precision_narrower():
    x = np.float32(1e5)  # past float16's 65504
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(x))
    assert float(cstorch.amp.round_to_cbfloat16(x)) == 99968.0  # 1.52587890625 * 2**16
    y = np.float32(1 + 2.0**-10 + 2.0**-12)  # float16 keeps 10 mantissa bits, cb16 9
    assert float(np.float16(y)) == 1 + 2.0**-10
    assert float(cstorch.amp.round_to_cbfloat16(y)) == 1 + 2.0**-9


def test_set_half_dtype_cbfloat16_computes_on_cbfloat16_values():
    """A CPU model under cbfloat16 sees its weights and inputs rounded to cbfloat16 and
    computes in float32; float16 would overflow on the same inputs."""
    cstorch.amp.set_half_dtype("cbfloat16")
    assert cstorch.amp.get_half_dtype() == jnp.float16  # cstorch's proxy dtype
    assert cstorch.amp.get_floating_point_dtype_str() == "cbfloat16"
    rng = np.random.default_rng(1)
    w = rng.normal(size=(8, 3)).astype(np.float32)
    x = (rng.normal(size=(4, 8)) * 3e5).astype(np.float32)
    seen = {}

    def apply(params, x):
        seen["dtype"] = (params["w"].dtype, x.dtype)
        return x @ params["w"]

    model = cstorch.compile(cstorch.FunctionalModel(apply, {"w": jnp.asarray(w)}), "CPU")
    out = np.asarray(model(x))
    assert seen["dtype"] == (jnp.float32, jnp.float32)
    want = _reference(x).astype(np.float64) @ _reference(w).astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    assert np.isfinite(out).all()
    with np.errstate(over="ignore"):
        x16 = x.astype(np.float16)
    as_f16 = np.asarray(jnp.asarray(x16) @ jnp.asarray(w, jnp.float16))
    assert not np.isfinite(as_f16).all()  # float16 overflows where cbfloat16 does not


def test_grad_scaler_defaults_follow_cbfloat16():
    cstorch.amp.set_half_dtype("cbfloat16")
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")
    assert scaler.max_loss_scale == 2.0**31
    cstorch.amp.set_half_dtype("float16")
    assert cstorch.amp.GradScaler(loss_scale="dynamic").max_loss_scale == 2.0**15


@pytest.mark.parametrize("name", ["float16", "bfloat16", "cbfloat16", "float32"])
def test_half_dtype_names_are_accepted(name):
    cstorch.amp.set_half_dtype(name)
    assert cstorch.amp.get_half_dtype_str() == name
