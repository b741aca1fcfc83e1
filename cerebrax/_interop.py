"""Conversions between torch tensors and JAX arrays (torch is imported only if used)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["to_numpy", "torch_to_jax"]


def torch_to_jax(t: Any) -> jax.Array:
    """A JAX array with the contents of a torch tensor (bfloat16 included)."""
    return jnp.asarray(to_numpy(t))


def to_numpy(x: Any) -> np.ndarray:
    """A numpy view or copy of a torch tensor, JAX array or numpy array."""
    if type(x).__module__.startswith("torch"):
        import torch

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    return np.asarray(x)
