"""maximum, minimum, fmax, fmin and clamp, with torch's gradients at ties and at NaN.

JAX's own rules split a tie 0.5/0.5 and give NaN nothing; torch's differ by op and, for
clamp, fmax and fmin, by torch version. So each lowering gives the value by jnp and the
gradient operand by operand: a share of 0, 0.5 or 1 of the output's gradient, by the rule
of the installed torch (0 times a NaN gradient is 0, as torch's masks give).

maximum and minimum: 0.5 each at a tie, all to the operand taken, 1 to both where either
is NaN. fmax and fmin: the same rule from torch 2.14; before, all to ``x`` where ``x``
is taken or ``y`` is NaN, else all to ``y``.

clamp's value is ``minimum(maximum(x, min), max)``, NaN from any operand propagating, and
every element is ``max`` where ``min > max``, as in torch. Its gradient:

- torch up to 2.13: ``x`` takes the gradient on the closed interval ``[min, max]``; a tensor
  bound takes it where it is strictly taken, and ``max`` wherever ``max < min``; NaN gives
  nothing.
- torch 2.14 and later: with scalar bounds ``x`` takes it only strictly inside. A one-sided
  tensor bound shares it with ``x`` as ``maximum``/``minimum`` do (0.5 each at a tie, 1 each
  at NaN). With two tensor bounds a tie splits 0.5/0.5 while ``min < max``; at
  ``min == max`` it goes to ``x`` on the tie, else to the bound taken.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from ._registry import lowering
from ._util import torch_release

aten = torch.ops.aten


#: Whether torch 2.14's rules hold (clamp, fmax, fmin), by the installed torch.
TIES_SPLIT = torch_release(torch.__version__) >= (2, 14)


def _by_shares(value, shares, *operands):
    """``value(*operands)``, whose gradient reaches each operand in the shares that
    ``shares(*operands)`` gives (one 0 / 0.5 / 1 array per operand)."""

    @jax.custom_jvp
    def f(*operands):
        return value(*operands)

    @f.defjvp
    def f_jvp(primals, tangents):
        out = f(*primals)
        total = jnp.zeros(out.shape, out.dtype)
        for share, tangent in zip(shares(*primals), tangents):
            if tangent.dtype == jax.dtypes.float0:  # an integer operand
                continue
            share = jnp.broadcast_to(share, out.shape).astype(out.dtype)
            tangent = jnp.broadcast_to(tangent.astype(out.dtype), out.shape)
            total = total + jnp.where(share == 0, jnp.zeros_like(tangent), share * tangent)
        return out, total

    if not jnp.issubdtype(jnp.result_type(*operands), jnp.inexact):
        return value(*operands)
    return f(*operands)


def _share(full, half=None):
    share = jnp.where(full, 1.0, 0.0)
    return share if half is None else jnp.where(half, 0.5, share)


def _shares_2_13(x, lo, hi, lo_tensor, hi_tensor):
    inside = True
    if lo is not None:
        inside = inside & (x >= lo)
    if hi is not None:
        inside = inside & (x <= hi)
    shares = [_share(inside)]
    if lo_tensor:
        taken = (x < lo) & (lo < hi) if hi is not None else x < lo
        shares.append(_share(taken))
    if hi_tensor:
        taken = (x > hi) | (hi < lo) if lo is not None else x > hi
        shares.append(_share(taken))
    return shares


def _shares_2_14(x, lo, hi, lo_tensor, hi_tensor):
    if not (lo_tensor or hi_tensor):  # scalar bounds: strictly inside
        inside = True
        if lo is not None:
            inside = inside & (x > lo)
        if hi is not None:
            inside = inside & (x < hi)
        return [_share(inside)]
    if lo is None or hi is None:  # one tensor bound: maximum's / minimum's rule
        return list(_max_shares(x, lo) if hi is None else _min_shares(x, hi))
    ordered = lo < hi
    x_tie = ((x == lo) | (x == hi)) & ordered
    shares = [_share(~(x < lo) & ~(x > hi), x_tie)]
    shares.append(_share((x < lo) & (lo <= hi), (x == lo) & ordered))
    shares.append(_share(((x > hi) & (lo <= hi)) | (lo > hi), (x == hi) & ordered))
    return shares


def _value(x, lo, hi):
    out = x
    if lo is not None:
        out = jnp.maximum(out, lo)
    if hi is not None:
        out = jnp.minimum(out, hi)
    return out


def _is_tensor(bound) -> bool:
    return bound is not None and not isinstance(bound, (int, float))


def _clamp(x, lo, hi):
    lo_tensor, hi_tensor = _is_tensor(lo), _is_tensor(hi)
    rule = _shares_2_14 if TIES_SPLIT else _shares_2_13

    def split(operands):
        rest = iter(operands[1:])
        return operands[0], (next(rest) if lo_tensor else lo), (next(rest) if hi_tensor else hi)

    operands = (x,) + ((lo,) if lo_tensor else ()) + ((hi,) if hi_tensor else ())
    return _by_shares(
        lambda *o: _value(*split(o)),
        lambda *o: rule(*split(o), lo_tensor, hi_tensor),
        *operands)


@lowering(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):  # noqa: A002
    return _clamp(x, min, max)


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x, min):  # noqa: A002
    return _clamp(x, min, None)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x, max):  # noqa: A002
    return _clamp(x, None, max)


def _max_shares(x, y):
    tie = x == y
    return _share(~(x < y), tie), _share(~(x > y), tie)


def _min_shares(x, y):
    tie = x == y
    return _share(~(x > y), tie), _share(~(x < y), tie)


def _fmax_shares_2_13(x, y):
    taken = (x >= y) | jnp.isnan(y)
    return _share(taken), _share(~taken)


def _fmin_shares_2_13(x, y):
    taken = (x <= y) | jnp.isnan(y)
    return _share(taken), _share(~taken)


@lowering(aten.maximum.default)
def maximum(x, y):
    return _by_shares(jnp.maximum, _max_shares, x, y)


@lowering(aten.minimum.default)
def minimum(x, y):
    return _by_shares(jnp.minimum, _min_shares, x, y)


@lowering(aten.fmax.default)
def fmax(x, y):
    return _by_shares(jnp.fmax, _max_shares if TIES_SPLIT else _fmax_shares_2_13, x, y)


@lowering(aten.fmin.default)
def fmin(x, y):
    return _by_shares(jnp.fmin, _min_shares if TIES_SPLIT else _fmin_shares_2_13, x, y)
