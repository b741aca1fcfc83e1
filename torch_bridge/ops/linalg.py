"""Matrix products: mm, addmm, bmm, baddbmm, mv, dot."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from ._registry import lowering
from ._util import broadcast_accumulating
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
    bias = broadcast_accumulating(bias, jnp.broadcast_shapes(jnp.shape(bias), out.shape))
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


def _ragged_rows(x, weight, offs):
    """Rows of ``x`` sorted by group times their group's matrix: rows ``offs[g-1]`` to
    ``offs[g]`` use ``weight[g]``; rows past ``offs[-1]`` give zeros (a mixture of
    experts' tokens, grouped by expert). One ``lax.ragged_dot``: no per-group loop, no
    data-dependent shape."""
    import jax

    offs = offs.astype(jnp.int32)
    sizes = jnp.diff(offs, prepend=jnp.zeros((1,), jnp.int32))
    return jax.lax.ragged_dot(x, weight, sizes)


@lowering(aten._grouped_mm.default)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    if a.ndim == 3 and b.ndim == 3:  # one product per group, no offsets
        out = jnp.matmul(a, b)
    elif a.ndim == 2 and b.ndim == 3 and offs is not None:
        out = _ragged_rows(a, b, offs)
    else:
        raise NotImplementedError(
            f"torch_bridge lowers aten._grouped_mm for 3-d x 3-d operands and for 2-d rows "
            f"x 3-d groups with offsets; got {a.ndim}-d x {b.ndim}-d"
            f"{' with' if offs is not None else ' without'} offsets.")
    if bias is not None:
        out = out + bias
    return out if out_dtype is None else out.astype(out_dtype)


@lowering("transformers.grouped_mm_fallback.default")
def transformers_grouped_mm(x, weight, offs):
    """transformers' grouped matmul for mixture-of-experts layers (a Python loop over
    the experts in eager torch): ``x`` sorted by expert, ``offs`` the cumulative token
    counts per expert."""
    return _ragged_rows(x, weight, offs)
