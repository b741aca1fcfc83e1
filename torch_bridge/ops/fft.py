"""FFTs: torch's internal real-to-complex, complex-to-real and complex-to-complex ops."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from ._registry import lowering

aten = torch.ops.aten

# torch's normalization codes: 0 none, 1 by sqrt(n), 2 by n. numpy's `norm` names the
# direction that is scaled, so the same code means different names forward and back.
_FORWARD = {0: "backward", 1: "ortho", 2: "forward"}
_INVERSE = {0: "forward", 1: "ortho", 2: "backward"}


@lowering(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    dim = tuple(dim)
    if onesided:
        return jnp.fft.rfftn(x, axes=dim, norm=_FORWARD[normalization])
    return jnp.fft.fftn(x, axes=dim, norm=_FORWARD[normalization])


@lowering(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    dim = tuple(dim)
    sizes = [x.shape[d] for d in dim[:-1]] + [int(last_dim_size)]
    return jnp.fft.irfftn(x, s=sizes, axes=dim, norm=_INVERSE[normalization])


@lowering(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    dim = tuple(dim)
    if forward:
        return jnp.fft.fftn(x, axes=dim, norm=_FORWARD[normalization])
    return jnp.fft.ifftn(x, axes=dim, norm=_INVERSE[normalization])
