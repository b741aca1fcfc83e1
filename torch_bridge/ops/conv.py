"""Convolution (plain, transposed, grouped, dilated; 1-d, 2-d, 3-d)."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ._registry import lowering

aten = torch.ops.aten

_SPATIAL = "DHW"


def _dimension_numbers(n: int) -> lax.ConvDimensionNumbers:
    s = _SPATIAL[-n:] if n <= 3 else None
    if s is None:
        raise NotImplementedError(f"convolution over {n} spatial dims has no lowering.")
    return lax.conv_dimension_numbers(
        (1, 1) + (1,) * n, (1, 1) + (1,) * n, ("NC" + s, "OI" + s, "NC" + s)
    )


def _transposed_kernel(w, groups: int):
    """A transposed convolution's (in, out/g, *k) weight as a forward (out, in/g, *k) one,
    spatially flipped."""
    cin, cout_g, *k = w.shape
    w = w.reshape((groups, cin // groups, cout_g, *k))
    w = jnp.swapaxes(w, 1, 2).reshape((groups * cout_g, cin // groups, *k))
    return jnp.flip(w, axis=tuple(range(2, 2 + len(k))))


@lowering(aten.convolution.default)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = w.ndim - 2
    stride, padding, dilation = (list(v) * n if len(v) == 1 else list(v)
                                 for v in (stride, padding, dilation))
    dn = _dimension_numbers(n)
    if not transposed:
        out = lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups,
        )
    else:
        output_padding = list(output_padding) * n if len(output_padding) == 1 else list(
            output_padding)
        k = w.shape[2:]
        pads = [
            (d * (ks - 1) - p, d * (ks - 1) - p + op)
            for ks, p, d, op in zip(k, padding, dilation, output_padding)
        ]
        out = lax.conv_general_dilated(
            x, _transposed_kernel(w, groups), window_strides=(1,) * n, padding=pads,
            lhs_dilation=stride, rhs_dilation=dilation, dimension_numbers=dn,
            feature_group_count=groups,
        )
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * n)
    return out


@lowering(aten.col2im.default)
def col2im(x, output_size, kernel_size, dilation, padding, stride):
    """``F.fold``: sums sliding blocks (N, C*kh*kw, L) back into an (N, C, H, W) image."""
    (h, w), (kh, kw) = output_size, kernel_size
    (dh, dw), (ph, pw), (sh, sw) = dilation, padding, stride
    batched = x.ndim == 3
    if not batched:
        x = x[None]
    n, ckk, _ = x.shape
    c = ckk // (kh * kw)
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    blocks = x.reshape(n, c, kh, kw, oh, ow)
    out = jnp.zeros((n, c, h + 2 * ph, w + 2 * pw), x.dtype)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + (oh - 1) * sh + 1, sh)
            cols = slice(j * dw, j * dw + (ow - 1) * sw + 1, sw)
            out = out.at[:, :, rows, cols].add(blocks[:, :, i, j])
    out = out[:, :, ph:ph + h, pw:pw + w]
    return out if batched else out[0]
