"""Convolution (plain, transposed, grouped, dilated; 1-d, 2-d, 3-d).

On CPU, a grouped convolution's weight gradient is computed as one batched product per
kernel offset (:func:`_grouped_conv`). JAX's own rule expresses it as a convolution with
``batch_group_count``, which XLA's CPU backend rewrites into a dense convolution over a
masked ``(C, C, *k)`` kernel: 127 MiB of temporaries for one 5x5 depthwise layer of
1152 channels (EfficientNet-B0), against the few KiB of the weight itself.
"""

from __future__ import annotations

import functools
import itertools

import jax
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
    if not transposed and groups > 1 and jax.default_backend() == "cpu":
        out = _grouped_conv(tuple(stride), tuple(padding), tuple(dilation), groups, x, w)
    elif not transposed:
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


def _plain_conv(stride, padding, dilation, groups, x, w):
    return lax.conv_general_dilated(
        x, w, window_strides=stride, padding=[(p, p) for p in padding],
        rhs_dilation=dilation, dimension_numbers=_dimension_numbers(w.ndim - 2),
        feature_group_count=groups)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _grouped_conv(stride, padding, dilation, groups, x, w):
    """A grouped convolution whose weight gradient never builds a dense kernel."""
    return _plain_conv(stride, padding, dilation, groups, x, w)


def _grouped_conv_fwd(stride, padding, dilation, groups, x, w):
    return _plain_conv(stride, padding, dilation, groups, x, w), (x, w)


def _grouped_conv_bwd(stride, padding, dilation, groups, residuals, g):
    x, w = residuals
    _, x_vjp = jax.vjp(lambda x_: _plain_conv(stride, padding, dilation, groups, x_, w), x)
    (dx,) = x_vjp(g)
    return dx, _grouped_weight_grad(stride, padding, dilation, groups, x, g, w.shape)


def _grouped_weight_grad(stride, padding, dilation, groups, x, g, w_shape):
    """``dw[o, i, *k]``: for each kernel offset ``k``, the input window that offset saw
    (a strided slice of the padded input) against the output gradient, one product per
    group: ``sum over batch and positions of x_k[n, gi, ...] * g[n, go, ...]``.

    The offsets run as a ``lax.map`` loop, so the program holds one product, not one
    per offset (a 5x5 kernel would otherwise add 25 slices and products per layer, and
    XLA's compile memory grows with them)."""
    cout, cin_g, *kernel = w_shape
    n, spatial = x.shape[0], g.shape[2:]
    x = jnp.pad(x, [(0, 0), (0, 0), *((p, p) for p in padding)])
    xg = x.reshape(n, groups, cin_g, *x.shape[2:])
    gg = g.reshape(n, groups, cout // groups, *spatial)
    pos = "xyz"[:len(spatial)]
    extent = [(size - 1) * s + 1 for size, s in zip(spatial, stride)]
    offsets = jnp.asarray(list(itertools.product(*(range(k) for k in kernel))), jnp.int32)

    def one_offset(offset):
        start = [0, 0, 0, *(offset * jnp.asarray(dilation, jnp.int32))]
        window = lax.dynamic_slice(xg, start, (*xg.shape[:3], *extent))
        window = lax.slice(window, (0,) * window.ndim, window.shape,
                           (1, 1, 1, *stride))
        return jnp.einsum(f"ngi{pos},ngo{pos}->goi", window, gg,
                          preferred_element_type=jnp.float32)

    per_offset = lax.map(one_offset, offsets)  # [K, groups, cout / groups, cin / groups]
    dw = jnp.moveaxis(per_offset, 0, -1).reshape(cout, cin_g, *kernel)
    return dw.astype(g.dtype)


_grouped_conv.defvjp(_grouped_conv_fwd, _grouped_conv_bwd)


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
