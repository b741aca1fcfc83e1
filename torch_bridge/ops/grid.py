"""``F.grid_sample``: bilinear, nearest and bicubic sampling at grid locations (2-d)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from cerebrax.errors import UnsupportedOpError

from ._registry import lowering

aten = torch.ops.aten


def _unnormalize(coord, size: int, align_corners: bool):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, twice_low: int, twice_high: int):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _source(coord, size: int, padding_mode: int, align_corners: bool):
    return _padded(_unnormalize(coord, size, align_corners), size, padding_mode,
                   align_corners)


def _padded(coord, size: int, padding_mode: int, align_corners: bool):
    """A pixel coordinate moved inside the image by the padding mode (zeros: as it is)."""
    if padding_mode == 1:  # border
        coord = jnp.clip(coord, 0, size - 1)
    elif padding_mode == 2:  # reflection
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        coord = jnp.clip(coord, 0, size - 1)
    return coord


def _sample_one(image, ix, iy, mode: int):
    """image (C, H, W); ix, iy (Ho, Wo) source pixel coordinates -> (C, Ho, Wo)."""
    _, h, w = image.shape

    def tap(yi, xi):
        inside = (xi >= 0) & (xi <= w - 1) & (yi >= 0) & (yi <= h - 1)
        yc = jnp.clip(yi, 0, h - 1).astype(jnp.int32)
        xc = jnp.clip(xi, 0, w - 1).astype(jnp.int32)
        return jnp.where(inside, image[:, yc, xc], jnp.zeros((), image.dtype))

    if mode == 1:  # nearest (round half to even, as torch's nearbyint)
        return tap(jnp.round(iy), jnp.round(ix))
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    x1, y1 = x0 + 1, y0 + 1
    wx1, wy1 = ix - x0, iy - y0
    wx0, wy0 = 1 - wx1, 1 - wy1
    return (tap(y0, x0) * (wy0 * wx0) + tap(y0, x1) * (wy0 * wx1)
            + tap(y1, x0) * (wy1 * wx0) + tap(y1, x1) * (wy1 * wx1))


def _cubic_weights(t):
    """torch's cubic convolution weights (A = -0.75) of the taps at -1, 0, 1, 2 for a
    fractional offset ``t``."""
    a = -0.75

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return far(t + 1), near(t), near(1 - t), far(2 - t)


def _bicubic(image, ix, iy, padding_mode: int, align_corners: bool):
    """image (C, H, W); ix, iy (Ho, Wo) unnormalized coordinates -> (C, Ho, Wo): 16 taps,
    each moved inside by the padding mode, as torch's bicubic grid_sample."""
    _, h, w = image.shape
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    wx, wy = _cubic_weights(ix - x0), _cubic_weights(iy - y0)

    def tap(yi, xi):
        yi = _padded(yi, h, padding_mode, align_corners)
        xi = _padded(xi, w, padding_mode, align_corners)
        inside = (xi >= 0) & (xi <= w - 1) & (yi >= 0) & (yi <= h - 1)
        yc = jnp.clip(yi, 0, h - 1).astype(jnp.int32)
        xc = jnp.clip(xi, 0, w - 1).astype(jnp.int32)
        return jnp.where(inside, image[:, yc, xc], jnp.zeros((), image.dtype))

    out = 0
    for i in range(4):
        row = sum(tap(y0 - 1 + i, x0 - 1 + j) * wx[j] for j in range(4))
        out = out + row * wy[i]
    return out


@lowering(aten.grid_sampler_2d.default)
def grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners):
    h, w = x.shape[-2:]
    if interpolation_mode == 2:  # bicubic: padding applies to every tap
        ix = _unnormalize(grid[..., 0], w, align_corners)
        iy = _unnormalize(grid[..., 1], h, align_corners)
        return jax.vmap(lambda im, gx, gy: _bicubic(im, gx, gy, padding_mode,
                                                    align_corners))(x, ix, iy)
    if interpolation_mode not in (0, 1):
        raise UnsupportedOpError(
            f"grid_sampler_2d has no lowering for interpolation mode {interpolation_mode}.")
    ix = _source(grid[..., 0], w, padding_mode, align_corners)
    iy = _source(grid[..., 1], h, padding_mode, align_corners)
    return jax.vmap(lambda im, gx, gy: _sample_one(im, gx, gy, interpolation_mode))(x, ix, iy)
