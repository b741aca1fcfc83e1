"""Elementwise lowerings: arithmetic, comparisons, math functions, activations."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ._registry import lowering
from ._scalar_ops import half_arithmetic, half_result
from ._util import is_half, kept, maybe_cast, rounded_product, widened

aten = torch.ops.aten


def _is_int(x) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    return hasattr(x, "dtype") and (
        jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_
    )


# ---- arithmetic ----------------------------------------------------------------------
# A half-precision result with a scalar operand follows torch's kernels (_scalar_ops).
@lowering(aten.add.Tensor, aten.add.Scalar)
def add(x, y, alpha=1):
    return _sum(x, y, alpha)


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, alpha=1):
    return _sum(x, y, -alpha)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(x, y, alpha=1):
    return _sum(y, x, -alpha)


def _sum(x, y, alpha):
    half = half_result(x, y)
    if half is None:
        return x + y if alpha == 1 else x + alpha * y
    return half_arithmetic("add", x, y, half, alpha)


@lowering(aten.mul.Tensor, aten.mul.Scalar)
def mul(x, y):
    half = half_result(x, y)
    if half is None:
        return rounded_product(x, y)
    return half_arithmetic("mul", x, y, half)


@lowering(aten.div.Tensor, aten.div.Scalar)
def div(x, y):
    half = half_result(x, y)
    if half is None:
        return jnp.true_divide(x, y)
    return half_arithmetic("div", x, y, half)


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(x, y, rounding_mode=None):
    if rounding_mode is None:
        return jnp.true_divide(x, y)
    if rounding_mode == "floor":
        return jnp.floor_divide(x, y)
    if _is_int(x) and _is_int(y):
        q = jnp.floor_divide(x, y)
        # floor -> trunc: step towards zero where the signs differ and there is a remainder
        return jnp.where((jnp.remainder(x, y) != 0) & ((x < 0) != (y < 0)), q + 1, q)
    return jnp.trunc(jnp.true_divide(x, y))


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(x, y):
    return jnp.floor_divide(x, y)


@lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(x, y):
    return jnp.remainder(x, y)


@lowering(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(x, y):
    return jnp.fmod(x, y)


@lowering(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_(x, y):
    if isinstance(y, (int, float)) and not isinstance(y, bool):
        if y == 2:
            return x * x
        if y == 0.5:
            return jnp.sqrt(x)
        if float(y).is_integer() and _is_int(x):
            return lax.integer_pow(x, int(y)) if y >= 0 else jnp.power(x, y)
        if float(y).is_integer() and hasattr(x, "dtype") and is_half(x):
            return _half_integer_pow(x, int(y))
    return jnp.power(x, y)


def _half_power(x, n: int):
    """torch's CPU ``x ** n`` for a float16 / bfloat16 ``x`` and an integer ``n``:
    computed in float32 and rounded once, except bfloat16's ``x ** 3`` and ``x ** -2``,
    whose kernels round each product (and the reciprocal). Products of half values in a
    chain otherwise round otherwise than torch on 24-48% of elements."""
    if n == 0:
        return jnp.ones_like(x)
    if n == 1:
        return x
    if n == 2:
        return rounded_product(x, x)
    if x.dtype == jnp.bfloat16 and n in (3, -2):
        square = rounded_product(x, x)
        return rounded_product(square, x) if n == 3 else kept(1 / square)
    return lax.integer_pow(widened(x), n).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _half_integer_pow(x, n: int):
    return _half_power(x, n)


def _half_integer_pow_fwd(x, n):
    return _half_power(x, n), x


def _half_integer_pow_bwd(n, x, g):
    """torch's formula, ``g * (n * x ** (n - 1))``, each operation rounded as torch's
    kernels round it (the power as above, ``n`` times it in float32)."""
    if n == 0:
        return (jnp.zeros_like(x),)
    scaled = (widened(_half_power(x, n - 1)) * jnp.float32(n)).astype(x.dtype)
    return (rounded_product(g.astype(x.dtype), scaled),)


_half_integer_pow.defvjp(_half_integer_pow_fwd, _half_integer_pow_bwd)


@lowering(aten.atan2.default)
def atan2(x, y):
    return jnp.arctan2(x, y)


@lowering(aten.hypot.default)
def hypot(x, y):
    out = jnp.hypot(x, y)
    if is_half(out):  # torch's kernel computes in float32 and rounds once
        return jnp.hypot(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)).astype(
            out.dtype)
    return out


@lowering(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(x, y):
    return jnp.copysign(x, y)


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(x, end, weight):
    """torch's formula (from the nearer end), in float32 for half operands, rounded once."""
    dtype = jnp.result_type(x, end, weight)
    if is_half(jnp.zeros((), dtype)):
        x, end, weight = (jnp.asarray(v, jnp.float32) for v in (x, end, weight))
    diff = end - x
    out = jnp.where(jnp.abs(weight) < 0.5, x + weight * diff, end - diff * (1 - weight))
    return out.astype(dtype)


@lowering(aten.addcmul.default)
def addcmul(x, t1, t2, value=1):
    return x + value * t1 * t2


@lowering(aten.addcdiv.default)
def addcdiv(x, t1, t2, value=1):
    return x + value * t1 / t2


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(cond, x, y):
    return jnp.where(cond, x, y)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value, dtype=x.dtype), x)


@lowering(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


# ---- comparisons and logic -----------------------------------------------------------
def _binary(jfn):
    def fn(x, y):
        return jfn(x, y)
    fn.__name__ = jfn.__name__
    return fn


for _ops, _fn in [
    ((aten.eq.Tensor, aten.eq.Scalar), jnp.equal),
    ((aten.ne.Tensor, aten.ne.Scalar), jnp.not_equal),
    ((aten.lt.Tensor, aten.lt.Scalar), jnp.less),
    ((aten.le.Tensor, aten.le.Scalar), jnp.less_equal),
    ((aten.gt.Tensor, aten.gt.Scalar), jnp.greater),
    ((aten.ge.Tensor, aten.ge.Scalar), jnp.greater_equal),
    ((aten.logical_and.default,), jnp.logical_and),
    ((aten.logical_or.default,), jnp.logical_or),
    ((aten.logical_xor.default,), jnp.logical_xor),
    ((aten.bitwise_and.Tensor, aten.bitwise_and.Scalar), jnp.bitwise_and),
    ((aten.bitwise_or.Tensor, aten.bitwise_or.Scalar), jnp.bitwise_or),
    ((aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar), jnp.bitwise_xor),
    ((aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar), jnp.left_shift),
    ((aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar),
     jnp.right_shift),
]:
    lowering(*_ops)(_binary(_fn))


@lowering(aten.logical_not.default)
def logical_not(x):
    return jnp.logical_not(x)


@lowering(aten.bitwise_not.default)
def bitwise_not(x):
    return jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.bitwise_not(x)


@lowering(aten.isnan.default)
def isnan(x):
    return jnp.isnan(x)


@lowering(aten.isinf.default)
def isinf(x):
    return jnp.isinf(x)


@lowering(aten.isfinite.default)
def isfinite(x):
    return jnp.isfinite(x)


@lowering(aten.isposinf.default)
def isposinf(x):
    return jnp.isposinf(x)


@lowering(aten.isneginf.default)
def isneginf(x):
    return jnp.isneginf(x)


# ---- unary math ----------------------------------------------------------------------
def _in_float32(fn):
    """``fn`` of a float16 or bfloat16 ``x`` computed in float32 and rounded once, as
    torch's CPU kernels compute these functions (and their backward kernels the
    gradients, which JAX's differentiation of the float32 computation rounds once too).
    Computed in the half dtype, 30-40% of the elements of a bf16 ``gelu`` or
    ``sigmoid`` differed from torch eager's."""
    @functools.wraps(fn)
    def wrapped(x, *args, **kwargs):
        if not is_half(x):
            return fn(x, *args, **kwargs)
        return fn(widened(x), *args, **kwargs).astype(x.dtype)

    return wrapped


def _float(x):
    """Integer inputs of floating functions compute in float32, as torch does."""
    return x.astype(jnp.float32) if _is_int(x) else x


def _unary(jfn, *, floating=True):
    def fn(x):
        return jfn(_float(x) if floating else x)
    fn.__name__ = getattr(jfn, "__name__", "unary")
    return fn


# The backward of these uses the rounded half output, as torch's formulas do (its
# sigmoid and tanh backward kernels compute ``g * (1 - y) * y`` and ``g * (1 - y * y)``
# in float32; sqrt's is ``g / (2 * y)``; rsqrt's ``(-0.5 * g) * y ** 3``, each step
# rounded): differentiated in float32 from the unrounded output, 20-60% of the
# gradient's elements differed from torch's.
def _from_output(jfn, grad):
    @jax.custom_vjp
    def half_fn(x):
        return jfn(widened(x)).astype(x.dtype)

    def forward(x):
        y = half_fn(x)
        return y, y

    def backward(y, g):
        return (grad(g, y).astype(y.dtype),)

    half_fn.defvjp(forward, backward)

    def fn(x):
        x = _float(x)
        return half_fn(x) if is_half(x) else jfn(x)

    fn.__name__ = getattr(jfn, "__name__", "unary")
    return fn


def _sigmoid_grad(g, y):
    """torch's kernel: in float32 for bfloat16; for float16, ``(g * (1 - y)) * y`` with
    each step rounded to float16."""
    if y.dtype == jnp.float16:
        complement = (1 - widened(y)).astype(y.dtype)
        step = (widened(g) * widened(complement)).astype(y.dtype)
        return widened(step) * widened(y)
    return widened(g) * (1 - widened(y)) * widened(y)


def _rsqrt_grad(g, y):
    scaled = (-0.5 * widened(g)).astype(y.dtype)
    cube = (widened(y) ** 3).astype(y.dtype)
    return widened(scaled) * widened(cube)


for _op, _fn, _grad in [
    (aten.sigmoid.default, jax.nn.sigmoid, _sigmoid_grad),
    (aten.tanh.default, jnp.tanh, lambda g, y: widened(g) * (1 - widened(y) ** 2)),
    (aten.sqrt.default, jnp.sqrt, lambda g, y: widened(g) / (2 * widened(y))),
    (aten.rsqrt.default, lax.rsqrt, _rsqrt_grad),
]:
    lowering(_op)(_from_output(_fn, _grad))

for _op, _fn in [
    (aten.exp.default, jnp.exp), (aten.exp2.default, jnp.exp2),
    (aten.expm1.default, jnp.expm1), (aten.log.default, jnp.log),
    (aten.log1p.default, jnp.log1p), (aten.log2.default, jnp.log2),
    (aten.log10.default, jnp.log10), (aten.sin.default, jnp.sin),
    (aten.cos.default, jnp.cos), (aten.tan.default, jnp.tan),
    (aten.asin.default, jnp.arcsin), (aten.acos.default, jnp.arccos),
    (aten.atan.default, jnp.arctan), (aten.sinh.default, jnp.sinh),
    (aten.cosh.default, jnp.cosh),
    (aten.asinh.default, jnp.arcsinh), (aten.acosh.default, jnp.arccosh),
    (aten.atanh.default, jnp.arctanh), (aten.erf.default, jax.scipy.special.erf),
    (aten.erfc.default, jax.scipy.special.erfc),
    (aten.erfinv.default, jax.scipy.special.erfinv),
    (aten.reciprocal.default, jnp.reciprocal),
    (aten.lgamma.default, jax.scipy.special.gammaln),
    (aten.digamma.default, jax.scipy.special.digamma),
    (aten.i0.default, jax.scipy.special.i0),
]:
    lowering(_op)(_unary(_fn))

for _op, _fn in [
    (aten.abs.default, jnp.abs), (aten.neg.default, jnp.negative),
    (aten.sign.default, jnp.sign), (aten.sgn.default, jnp.sign),
]:
    lowering(_op)(_unary(_fn, floating=False))


def _rounding(jfn):
    def fn(x):
        return x if _is_int(x) else jfn(x)
    fn.__name__ = jfn.__name__
    return fn


for _op, _fn in [
    (aten.floor.default, jnp.floor), (aten.ceil.default, jnp.ceil),
    (aten.round.default, jnp.round), (aten.trunc.default, jnp.trunc),
]:
    lowering(_op)(_rounding(_fn))


@lowering(aten.round.decimals)
def round_decimals(x, decimals=0):
    scale = 10.0 ** decimals
    return jnp.round(x * scale) / scale


@lowering(aten.frac.default)
def frac(x):
    return x - jnp.trunc(x)


@lowering(aten.square.default)
def square(x):
    return x * x


@lowering(aten.logit.default)
@_in_float32
def logit(x, eps=None):
    if eps is not None:
        x = jnp.clip(x, eps, 1.0 - eps)
    return jnp.log(x / (1.0 - x))


# ---- activations ---------------------------------------------------------------------
@lowering(aten.relu.default)
def relu(x):
    # torch's gradient at 0 is 0 (maximum's would be 0.5); NaN passes through.
    return jnp.where(x <= 0, jnp.zeros((), x.dtype), x)


@lowering(aten.gelu.default)
@_in_float32
def gelu(x, approximate="none"):
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + jnp.tanh(inner))
    return 0.5 * x * (1.0 + jax.scipy.special.erf(x * (1.0 / math.sqrt(2.0))))


@lowering(aten.silu.default)
@_in_float32
def silu(x):
    return x * jax.nn.sigmoid(x)


@lowering(aten.mish.default)
@_in_float32
def mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


@lowering(aten.hardtanh.default)
def hardtanh(x, min_val=-1.0, max_val=1.0):
    # torch's gradient is 1 only strictly inside (min_val, max_val): ReLU6 at 0 gets 0.
    return jnp.where(x <= min_val, min_val, jnp.where(x >= max_val, max_val, x)).astype(x.dtype)


@lowering(aten.hardsigmoid.default)
@_in_float32
def hardsigmoid(x):
    return jnp.clip(x / 6.0 + 0.5, 0.0, 1.0)


@lowering(aten.hardswish.default)
@_in_float32
def hardswish(x):
    return x * jnp.clip(x + 3.0, 0.0, 6.0) / 6.0


@lowering(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lowering(aten.elu.default)
@_in_float32
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    return scale * jnp.where(x > 0, x, alpha * jnp.expm1(x * input_scale))


@lowering(aten.softplus.default)
@_in_float32
def softplus(x, beta=1.0, threshold=20.0):
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(jnp.minimum(bx, threshold))) / beta)


@lowering(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(x):
    return _in_float32(jax.nn.log_sigmoid)(x), jnp.zeros((0,), x.dtype)


@lowering(aten.prelu.default, aten._prelu_kernel.default)
def prelu(x, weight):
    if weight.size > 1 and x.ndim > 1:
        weight = weight.reshape((-1,) + (1,) * (x.ndim - 2))
    return jnp.where(x > 0, x, weight * x)


@lowering(aten.threshold.default)
def threshold(x, threshold, value):
    return jnp.where(x > threshold, x, value)


# ---- softmax and log-softmax -----------------------------------------------------------
# torch computes a half-precision (float16, bfloat16) softmax in float32 and rounds the
# result once (over another than the last dimension, its CPU kernel rounds each
# exponential to the half dtype before dividing by their float32 sum); over the last
# dimension its CPU log-softmax rounds the sum of exponentials and its log to the half
# dtype before subtracting. Each backward computes in float32 from the rounded output.
# Computed in the half dtype itself, as jax.nn does, outputs were up to 2 units in the
# last place off torch's, gradients 12. (In a bf16 GPT step this also puts the
# exponentials over the vocabulary in float32, where torch autocast has them.)
def _saving_output(fn):
    """A custom VJP's forward that keeps ``fn``'s rounded output for the backward."""
    def forward(x, dim):
        y = fn(x, dim)
        return y, y

    return forward


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _half_softmax(x, dim: int):
    x32 = x.astype(jnp.float32)
    e = jnp.exp(x32 - lax.stop_gradient(jnp.max(x32, axis=dim, keepdims=True)))
    total = jnp.sum(e, axis=dim, keepdims=True)
    if dim != x.ndim - 1:
        e = e.astype(x.dtype).astype(jnp.float32)
    return (e / total).astype(x.dtype)


def _half_softmax_bwd(dim, y, g):
    y32, g32 = y.astype(jnp.float32), g.astype(jnp.float32)
    return ((y32 * (g32 - jnp.sum(g32 * y32, axis=dim, keepdims=True))).astype(y.dtype),)


_half_softmax.defvjp(_saving_output(_half_softmax), _half_softmax_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _half_log_softmax(x, dim: int):
    x32 = x.astype(jnp.float32)
    if dim != x.ndim - 1:
        return jax.nn.log_softmax(x32, axis=dim).astype(x.dtype)
    shifted = x32 - lax.stop_gradient(jnp.max(x32, axis=dim, keepdims=True))
    total = jnp.sum(jnp.exp(shifted), axis=dim, keepdims=True).astype(x.dtype)
    log_total = jnp.log(total.astype(jnp.float32)).astype(x.dtype)
    return (shifted - log_total.astype(jnp.float32)).astype(x.dtype)


def _half_log_softmax_bwd(dim, y, g):
    g32 = g.astype(jnp.float32)
    total = jnp.sum(g32, axis=dim, keepdims=True)
    return ((g32 - jnp.exp(y.astype(jnp.float32)) * total).astype(y.dtype),)


_half_log_softmax.defvjp(_saving_output(_half_log_softmax), _half_log_softmax_bwd)


@lowering(aten._softmax.default)
def softmax(x, dim, half_to_float=False):
    x = maybe_cast(x, torch.float32) if half_to_float else x
    if x.ndim == 0:
        return jax.nn.softmax(x[None], axis=0)[0]
    if is_half(x):
        return _half_softmax(x, dim % x.ndim)
    return jax.nn.softmax(x, axis=dim)


@lowering(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float=False):
    """A 0-d ``x`` is one class (torch accepts dim 0 and -1 for it)."""
    x = maybe_cast(x, torch.float32) if half_to_float else x
    if x.ndim == 0:
        return jax.nn.log_softmax(x[None], axis=0)[0]
    if is_half(x):
        return _half_log_softmax(x, dim % x.ndim)
    return jax.nn.log_softmax(x, axis=dim)
