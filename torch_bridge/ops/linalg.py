"""Matrix products: mm, addmm, bmm, baddbmm, mv, dot."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from ._registry import lowering
from ._util import safe_sqrt

aten = torch.ops.aten


def _scaled(out, alpha):
    return out if alpha == 1 else alpha * out


@lowering(aten.mm.default)
def mm(a, b):
    return jnp.matmul(a, b)


@lowering(aten.bmm.default)
def bmm(a, b):
    return jnp.matmul(a, b)


@lowering(aten.addmm.default)
def addmm(bias, a, b, *, beta=1, alpha=1):
    out = _scaled(jnp.matmul(a, b), alpha)
    if beta == 0:
        return out
    return out + (bias if beta == 1 else beta * bias)


@lowering(aten.baddbmm.default)
def baddbmm(bias, a, b, *, beta=1, alpha=1):
    return addmm(bias, a, b, beta=beta, alpha=alpha)


@lowering(aten.addmv.default)
def addmv(bias, a, v, *, beta=1, alpha=1):
    return addmm(bias, a, v, beta=beta, alpha=alpha)


@lowering(aten.mv.default)
def mv(a, v):
    return jnp.matmul(a, v)


@lowering(aten.dot.default, aten.vdot.default)
def dot(a, b):
    return jnp.dot(a, b)


@lowering(aten.matmul.default)
def matmul(a, b):
    return jnp.matmul(a, b)


@lowering(aten.outer.default)
def outer(a, b):
    return jnp.outer(a, b)


@lowering(aten._cdist_forward.default)
def cdist(x1, x2, p, compute_mode=None):
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    if p == 2:
        return safe_sqrt(jnp.sum(diff * diff, axis=-1))
    if p == 0:
        return jnp.sum(diff != 0, axis=-1).astype(x1.dtype)
    if p == float("inf"):
        return jnp.max(jnp.abs(diff), axis=-1)
    return jnp.sum(jnp.abs(diff) ** p, axis=-1) ** (1.0 / p)


@lowering(aten._pdist_forward.default)
def pdist(x, p=2):
    """Distances between every pair of rows i < j, in row-major order."""
    n = x.shape[0]
    i, j = np.triu_indices(n, k=1)
    return cdist(x[None], x[None], p)[0][i, j]
