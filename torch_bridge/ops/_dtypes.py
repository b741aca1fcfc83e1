"""Dtype and array conversions between torch and JAX.

JAX runs with 64-bit types off by default, so torch's ``int64`` (indices, counters such
as BatchNorm's ``num_batches_tracked``) becomes ``int32`` and ``float64`` becomes
``float32``; with ``jax_enable_x64`` on they are kept.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

__all__ = ["export_dtype", "jax_dtype", "to_jax"]

_TORCH_TO_NUMPY: dict[torch.dtype, Any] = {
    torch.bool: np.bool_,
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.float16: np.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.complex64: np.complex64,
    torch.complex128: np.complex128,
    torch.uint16: np.uint16,
    torch.uint32: np.uint32,
    torch.uint64: np.uint64,
}


def jax_dtype(dtype: torch.dtype | None) -> Any:
    """The JAX dtype that stands for a torch dtype (64-bit types follow JAX's x64 flag)."""
    if dtype is None:
        return None
    try:
        np_dtype = _TORCH_TO_NUMPY[dtype]
    except KeyError:
        raise TypeError(f"torch_bridge has no JAX dtype for torch dtype {dtype}.") from None
    return jax.dtypes.canonicalize_dtype(np_dtype)


def export_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype to export with for an input of JAX dtype ``dtype``.

    Integer inputs export as ``torch.int64`` (what torch code expects of indices and
    class labels: JAX gives them ``int32`` unless x64 is on).
    """
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return torch.bool
    if np.issubdtype(dtype, np.integer):
        return torch.uint8 if dtype == np.uint8 else torch.int64
    for t, n in _TORCH_TO_NUMPY.items():
        if np.dtype(n) == dtype:
            return t
    raise TypeError(f"torch_bridge cannot export an input of dtype {dtype}.")


def to_jax(x: Any) -> jax.Array:
    """A JAX array from a torch tensor, numpy array or JAX array (tracers pass through)."""
    if isinstance(x, torch.Tensor) and hasattr(x, "__jax_array__"):
        return x.__jax_array__()  # a torch tensor of a compiled step (JaxTensor)
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            arr = t.view(torch.int16).numpy().view(jnp.bfloat16)
        else:
            arr = t.numpy()
        return _to_device(arr)
    if isinstance(x, (np.ndarray, np.generic)):
        return _to_device(x)
    return x


def _to_device(x: np.ndarray | np.generic) -> jax.Array:
    # Converted on the host (int64 to int32 unless x64 is on): on the device, the
    # conversion would compile a program per shape.
    return jax.device_put(np.asarray(x, dtype=jax.dtypes.canonicalize_dtype(x.dtype)))
