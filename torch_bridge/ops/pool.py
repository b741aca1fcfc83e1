"""Pooling and resampling: max / avg / adaptive pools, nearest and linear upsampling."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ._registry import lowering

aten = torch.ops.aten


def _tuple(v, n: int, default=None) -> tuple[int, ...]:
    if v is None or (not isinstance(v, int) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(e) for e in v)
    return v * n if len(v) == 1 else v


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    if ceil_mode:
        out = -(-span // s) + 1
        if (out - 1) * s >= size + p:  # the last window must start inside the input
            out -= 1
        return out
    return span // s + 1


def _window_pads(spatial, k, s, p, d, ceil_mode):
    outs, pads = [], []
    for size, ki, si, pi, di in zip(spatial, k, s, p, d):
        out = _out_size(size, ki, si, pi, di, ceil_mode)
        high = (out - 1) * si + di * (ki - 1) + 1 - size - pi
        outs.append(out)
        pads.append((pi, max(high, 0)))
    return outs, pads


def _init(value, dtype):
    """A window reduction's initial value as a concrete numpy scalar: JAX recognizes
    max / add windows (and their derivatives) only for concrete identities."""
    return np.asarray(value, dtype=np.dtype(dtype))


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    return jnp.iinfo(dtype).min


def _max_pool(x, kernel, stride, padding, dilation, ceil_mode, n):
    k = _tuple(kernel, n)
    s, p, d = _tuple(stride, n, k), _tuple(padding, n, 0), _tuple(dilation, n, 1)
    lead = x.ndim - n
    spatial = x.shape[lead:]
    _, pads = _window_pads(spatial, k, s, p, d, ceil_mode)
    window = dict(
        window_dimensions=(1,) * lead + k, window_strides=(1,) * lead + s,
        padding=((0, 0),) * lead + tuple(pads), window_dilation=(1,) * lead + d,
    )
    if any(di > 1 for di in d):
        # JAX has no derivative for dilated max windows: gather the window positions.
        values = _dilated_max(x, k, s, d, pads, lead)
    else:
        values = lax.reduce_window(x, _init(_lowest(x.dtype), x.dtype), lax.max, **window)
    # Indices (flat positions within each plane) never carry gradients: a variadic
    # window reduction over a stopped copy; XLA drops it when nothing reads it.
    plane = lax.broadcasted_iota(jnp.int32, spatial, 0)
    for a in range(1, n):
        plane = plane * spatial[a] + lax.broadcasted_iota(jnp.int32, spatial, a)
    idx = jnp.broadcast_to(plane, x.shape)

    def first_max(a, b):
        (av, ai), (bv, bi) = a, b
        take_a = (av > bv) | ((av == bv) & (ai < bi))
        if jnp.issubdtype(av.dtype, jnp.floating):
            take_a = take_a | (jnp.isnan(av) & ~jnp.isnan(bv))
        return jnp.where(take_a, av, bv), jnp.where(take_a, ai, bi)

    _, indices = lax.reduce_window(
        (lax.stop_gradient(x), idx),
        (_init(_lowest(x.dtype), x.dtype), np.int32(0)),
        first_max, **window,
    )
    return values, indices


def _dilated_max(x, k, s, d, pads, lead):
    """Max over windows as strided slices stacked on a new axis; the gradient goes to the
    first maximum of each window, as torch's does."""
    n = len(k)
    padded = lax.pad(x, _init(_lowest(x.dtype), x.dtype),
                     [(0, 0, 0)] * lead + [(lo, hi, 0) for lo, hi in pads])
    outs = [(padded.shape[lead + a] - d[a] * (k[a] - 1) - 1) // s[a] + 1 for a in range(n)]
    taps = []
    for offset in np.ndindex(*k):
        start = [0] * lead + [o * da for o, da in zip(offset, d)]
        limit = list(padded.shape[:lead]) + [
            st + (out - 1) * sa + 1 for st, out, sa in zip(start[lead:], outs, s)]
        taps.append(lax.slice(padded, start, limit, (1,) * lead + tuple(s)))
    stacked = jnp.stack(taps, axis=-1)
    first = jnp.argmax(lax.stop_gradient(stacked), axis=-1)[..., None]
    return jnp.take_along_axis(stacked, first, axis=-1)[..., 0]


@lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1,
                            ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 2)


@lowering(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1,
                            ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 3)


@lowering(aten.max_pool2d.default)
def max_pool2d(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 2)[0]


def _avg_divisor(size, k, s, p, out, count_include_pad):
    starts = np.arange(out) * s - p
    ends = np.minimum(starts + k, size + p)
    pool = ends - starts
    count = np.minimum(ends, size) - np.maximum(starts, 0)
    return pool if count_include_pad else count


def _avg_pool(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, n):
    k = _tuple(kernel, n)
    s, p = _tuple(stride, n, k), _tuple(padding, n, 0)
    lead = x.ndim - n
    spatial = x.shape[lead:]
    outs, pads = _window_pads(spatial, k, s, p, (1,) * n, ceil_mode)
    sums = lax.reduce_window(
        x, _init(0, x.dtype), lax.add, (1,) * lead + k, (1,) * lead + s,
        ((0, 0),) * lead + tuple(pads),
    )
    if divisor_override:
        return sums / divisor_override
    divisor = np.ones((), np.float64)
    for size, ki, si, pi, out in zip(spatial, k, s, p, outs):
        divisor = np.multiply.outer(
            divisor, _avg_divisor(size, ki, si, pi, out, count_include_pad))
    return sums / jnp.asarray(divisor, x.dtype)


@lowering(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, 2)


@lowering(aten.avg_pool3d.default)
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, 3)


@lowering(aten.avg_pool1d.default)
def avg_pool1d(x, kernel_size, stride=(), padding=0, ceil_mode=False,
               count_include_pad=True):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1)


def _bins(size: int, out: int) -> list[tuple[int, int]]:
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def _adaptive_avg(x, output_size, n):
    lead = x.ndim - n
    for a, out in zip(range(lead, x.ndim), output_size):
        size = x.shape[a]
        out = size if out is None else int(out)
        if size % out == 0:
            shape = x.shape[:a] + (out, size // out) + x.shape[a + 1:]
            x = jnp.mean(x.reshape(shape), axis=a + 1)
            continue
        weights = np.zeros((size, out), np.float32)
        for i, (lo, hi) in enumerate(_bins(size, out)):
            weights[lo:hi, i] = 1.0 / (hi - lo)
        x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(weights, x.dtype), axes=[[a], [0]]),
                         -1, a)
    return x


@lowering(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg(x, _tuple(output_size, 2), 2)


@lowering(aten._adaptive_avg_pool3d.default, aten.adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg(x, _tuple(output_size, 3), 3)


@lowering(aten.adaptive_avg_pool1d.default)
def adaptive_avg_pool1d(x, output_size):
    return _adaptive_avg(x, _tuple(output_size, 1), 1)


def _adaptive_max(x, output_size, n):
    lead = x.ndim - n
    spatial = x.shape[lead:]
    bins = [_bins(size, int(out)) for size, out in zip(spatial, output_size)]
    values, indices = [], []
    for cell in np.ndindex(*[len(b) for b in bins]):
        ranges = [bins[d][i] for d, i in enumerate(cell)]
        patch = x[(Ellipsis,) + tuple(slice(lo, hi) for lo, hi in ranges)]
        flat = patch.reshape(x.shape[:lead] + (-1,))
        values.append(jnp.max(flat, axis=-1))
        local = np.unravel_index(np.arange(flat.shape[-1]),
                                 tuple(hi - lo for lo, hi in ranges))
        pos = np.zeros(flat.shape[-1], np.int64)
        for d, (lo, _) in enumerate(ranges):
            pos = pos * spatial[d] + (local[d] + lo)
        indices.append(jnp.asarray(pos, jnp.int32)[jnp.argmax(flat, axis=-1)])
    shape = x.shape[:lead] + tuple(int(o) for o in output_size)
    return (jnp.stack(values, -1).reshape(shape), jnp.stack(indices, -1).reshape(shape))


@lowering(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(x, output_size):
    return _adaptive_max(x, _tuple(output_size, 2), 2)


@lowering(aten.adaptive_max_pool1d.default)
def adaptive_max_pool1d(x, output_size):
    return _adaptive_max(x, _tuple(output_size, 1), 1)


# ---- upsampling ------------------------------------------------------------------------
def _out_sizes(x, n, output_size, scale_factors):
    spatial = x.shape[-n:]
    if output_size:
        sizes = tuple(int(o) for o in output_size)
    else:
        sizes = tuple(int(math.floor(sz * sc)) for sz, sc in zip(spatial, scale_factors))
    scales = tuple(scale_factors) if scale_factors else (None,) * n
    return spatial, sizes, scales


def _scale(size: int, out: int, scale) -> np.float32:
    """torch's compute_scales_value: 1/scale_factor when given, else in/out (float32)."""
    if scale is not None and scale > 0:
        return np.float32(1.0 / scale)
    return np.float32(size / out)


def _nearest(x, n, output_size, scale_factors, exact: bool):
    spatial, sizes, scales = _out_sizes(x, n, output_size, scale_factors)
    lead = x.ndim - n
    for d, (size, out, sc) in enumerate(zip(spatial, sizes, scales)):
        s = _scale(size, out, sc)
        dst = np.arange(out, dtype=np.float32)
        src = np.floor((dst + np.float32(0.5)) * s if exact else dst * s).astype(np.int64)
        src = np.minimum(src, size - 1)
        x = jnp.take(x, jnp.asarray(src, jnp.int32), axis=lead + d)
    return x


def _vec_or_default(args, n):
    """Accepts both the .vec form (output_size, scale_factors) and the .default form
    (output_size, *per-dim scales)."""
    output_size, rest = args[0], args[1:]
    if len(rest) == 1 and (rest[0] is None or isinstance(rest[0], (list, tuple))):
        return output_size, rest[0]
    scales = list(rest[:n]) + [None] * (n - len(rest))
    return output_size, None if all(s is None for s in scales) else scales


def _nearest_lowering(n, exact):
    def fn(x, *args):
        output_size, scales = _vec_or_default(args, n)
        return _nearest(x, n, output_size, scales, exact)
    return fn


lowering(aten.upsample_nearest1d.vec, aten.upsample_nearest1d.default)(
    _nearest_lowering(1, False))
lowering(aten.upsample_nearest2d.vec, aten.upsample_nearest2d.default)(
    _nearest_lowering(2, False))
lowering(aten.upsample_nearest3d.vec, aten.upsample_nearest3d.default)(
    _nearest_lowering(3, False))
lowering(aten._upsample_nearest_exact1d.vec, aten._upsample_nearest_exact1d.default)(
    _nearest_lowering(1, True))
lowering(aten._upsample_nearest_exact2d.vec, aten._upsample_nearest_exact2d.default)(
    _nearest_lowering(2, True))
lowering(aten._upsample_nearest_exact3d.vec, aten._upsample_nearest_exact3d.default)(
    _nearest_lowering(3, True))


def _linear(x, n, output_size, align_corners, scale_factors):
    spatial, sizes, scales = _out_sizes(x, n, output_size, scale_factors)
    lead = x.ndim - n
    # Last spatial dim first: the same order of products and sums as torch's kernel.
    for d in reversed(range(n)):
        size, out, sc = spatial[d], sizes[d], scales[d]
        dst = np.arange(out, dtype=np.float32)
        if align_corners:
            s = np.float32((size - 1) / (out - 1)) if out > 1 else np.float32(0)
            src = dst * s
        else:
            src = np.maximum(_scale(size, out, sc) * (dst + np.float32(0.5)) - np.float32(0.5),
                             np.float32(0))
        i0 = src.astype(np.int64)
        i1 = np.minimum(i0 + 1, size - 1)
        l1 = (src - i0.astype(np.float32)).astype(np.float32)
        l0 = np.float32(1) - l1
        shape = (out,) + (1,) * (n - 1 - d)
        a = lead + d
        x0 = jnp.take(x, jnp.asarray(i0, jnp.int32), axis=a)
        x1 = jnp.take(x, jnp.asarray(i1, jnp.int32), axis=a)
        x = (jnp.asarray(l0.reshape(shape), x.dtype) * x0
             + jnp.asarray(l1.reshape(shape), x.dtype) * x1)
    return x


def _linear_lowering(n):
    def fn(x, output_size, align_corners, *rest):
        size, scales = _vec_or_default((output_size, *rest), n)
        return _linear(x, n, size, align_corners, scales)
    return fn


lowering(aten.upsample_linear1d.vec, aten.upsample_linear1d.default)(_linear_lowering(1))
lowering(aten.upsample_bilinear2d.vec, aten.upsample_bilinear2d.default)(_linear_lowering(2))
lowering(aten.upsample_trilinear3d.vec, aten.upsample_trilinear3d.default)(
    _linear_lowering(3))
