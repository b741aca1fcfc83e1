"""Conversions between torch tensors and JAX arrays (torch is imported only if used).

``torch_to_jax`` hands a torch tensor to JAX through DLPack when it can: a contiguous
CPU (or CUDA) tensor of a dtype JAX holds as is (float32, float16, bfloat16, int8 to
int32, uint8, bool, complex64, and the 64-bit ones under ``jax_enable_x64``) becomes a
JAX array over the same memory, no copy, provided the data is 64-byte aligned (JAX
copies a misaligned buffer). Other tensors go through numpy and are copied once.

Zero-copy inputs are safe in traced steps: a step donates only the registered state
(its first argument), never its inputs, so XLA never writes into a torch tensor's
memory. The JAX array keeps the torch storage alive through the DLPack capsule, so the
tensor may be dropped right after the conversion. Writing to the torch tensor in place
afterwards changes what the JAX array holds: a torch ``DataLoader`` gives a fresh
tensor per batch, so batches are never written again.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._filters import is_torch_tensor
from .._runtime import RUNTIME

__all__ = ["as_jax", "mark_torch_origin", "to_numpy", "to_torch", "torch_origin", "torch_to_jax"]


@functools.cache
def _dlpack_dtypes(x64: bool) -> frozenset:
    import torch

    dtypes = {torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int16,
              torch.int32, torch.uint8, torch.bool, torch.complex64}
    if x64:  # otherwise JAX narrows 64-bit arrays, which copies
        dtypes |= {torch.float64, torch.int64, torch.complex128}
    return frozenset(dtypes)


def _can_share(t: Any) -> bool:
    import torch

    return (t.device.type in ("cpu", "cuda") and t.layout == torch.strided
            and t.is_contiguous() and not t.is_conj() and not t.is_neg()
            and t.dtype in _dlpack_dtypes(bool(jax.config.jax_enable_x64)))


def as_jax(tree: Any) -> Any:
    """``tree`` with the torch tensors of a compiled step (``JaxTensor``) as JAX arrays.

    Inside a traced step torch code works on ``torch_bridge.JaxTensor`` values; cerebrax's
    own objects (optimizers, metrics, schedulers, the grad scaler) compute with JAX.
    """
    if "torch" not in sys.modules:
        return tree
    return jax.tree.map(lambda x: x.__jax_array__() if _is_step_tensor(x) else x, tree,
                        is_leaf=is_torch_tensor)


def _is_step_tensor(x: Any) -> bool:
    return is_torch_tensor(x) and hasattr(x, "__jax_array__")


def mark_torch_origin(array: jax.Array, torch_dtype: Any) -> None:
    """Records that ``array`` holds a torch tensor's values (a streamed torch batch).

    A traced step of a torch model sees such an input as a torch tensor of
    ``torch_dtype`` again, as it sees a torch tensor passed to it directly.
    """
    RUNTIME.torch_origins[array] = torch_dtype


def torch_origin(x: Any) -> Any:
    """The torch dtype of the tensor ``x`` was made from (:func:`mark_torch_origin`), or None."""
    return RUNTIME.torch_origins.get(x) if isinstance(x, jax.Array) else None


def torch_to_jax(t: Any, device: jax.Device | None = None) -> jax.Array:
    """A JAX array with the contents of a torch tensor (bfloat16 included).

    A contiguous CPU tensor of a dtype JAX keeps is shared through DLPack (no copy when
    the data is 64-byte aligned); anything else is copied through numpy. 64-bit tensors
    become 32-bit unless ``jax_enable_x64`` is on, as ``jnp.asarray`` does.

    Args:
      t: a torch tensor (one that requires grad is detached first).
      device: where the array should live; None leaves a shared array where its memory
        is (the host for CPU tensors) and puts a copied one on JAX's default device.
    """
    if hasattr(t, "__jax_array__"):  # a torch tensor of a compiled step: its JAX value
        return t.__jax_array__()
    t = t.detach()
    if _can_share(t):
        try:
            x = jax.dlpack.from_dlpack(t)
        except (BufferError, RuntimeError, TypeError, ValueError):
            x = None  # e.g. a CUDA tensor while JAX has no GPU: copy through numpy
        if x is not None:
            return x if device is None or device in x.devices() else jax.device_put(x, device)
    x = jnp.asarray(to_numpy(t))
    return x if device is None else jax.device_put(x, device)


def torch_leaves_to_jax(tree: Any) -> Any:
    """``tree`` with its torch tensor leaves as JAX arrays (:func:`torch_to_jax`: shared
    through DLPack where possible, bfloat16 included)."""
    if "torch" not in sys.modules or not any(
            is_torch_tensor(x) for x in jax.tree.leaves(tree, is_leaf=is_torch_tensor)):
        return tree
    return jax.tree.map(lambda x: torch_to_jax(x) if is_torch_tensor(x) else x, tree,
                        is_leaf=is_torch_tensor)


def to_numpy(x: Any) -> np.ndarray:
    """A numpy view or copy of a torch tensor, JAX array or numpy array.

    A CPU torch tensor becomes a view of its memory (bfloat16 as ``ml_dtypes.bfloat16``
    through its bits); tensors on other devices are copied to the host.
    """
    if is_torch_tensor(x):
        import torch

        t = x.detach().cpu()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    return np.asarray(x)


def to_torch(x: Any, dtype: Any = None, *, copy: bool = True) -> Any:
    """A CPU torch tensor holding ``x`` (numpy, JAX, a lazy checkpoint array, torch).

    With ``copy=True`` the tensor owns its memory: a JAX array is copied to the host
    (never aliased: a traced step may donate its buffer), a numpy array is copied too.
    ``copy=False`` shares a writable numpy array's memory (the caller owns the array).
    ``dtype`` (a torch dtype) casts the result, as ``tensor.copy_`` would.
    """
    import torch

    if isinstance(x, torch.Tensor):
        t = x.detach()
    else:
        if isinstance(x, np.ndarray) and not copy and x.flags.writeable:
            array = x
        else:
            array = np.array(x, copy=True)  # host sync point for a JAX array
        if array.dtype.name == "bfloat16":
            t = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(array)
    return t if dtype is None or t.dtype == dtype else t.to(dtype)
