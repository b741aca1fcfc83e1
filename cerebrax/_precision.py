"""The precision policy: which dtype a compiled model computes in.

On the CSX backend cerebrax follows the wafer: weights stay float32 and the model's
forward and backward run in float16 (mixed precision is on by default). On CPU and
GPU the model computes in float32 unless :func:`set_half_dtype` chose a half dtype or
:func:`enable_mixed_precision` turned mixed precision on. ``set_half_dtype("float32")``
turns mixed precision off on every backend, which is how the emulated wafer is
compared with a float32 single-device run. :class:`autocast` overrides the policy for
the model calls made under it; on the CPU backend it is torch's own autocast for torch
code (models and the step's torch operations), as cstorch's is.

``cbfloat16`` is Cerebras' own 16-bit float: 1 sign bit, 6 exponent bits and 9
explicit mantissa bits (twice float16's exponent range). No JAX dtype holds it, so
cerebrax emulates it: where a model computes in the half dtype, its weights, buffers
and inputs are rounded to the nearest cbfloat16 value (bit-exact round-to-nearest-
even, with subnormals, and infinity past the largest finite value) and kept in
float32, and the model's operations compute in float32 on those values, as the
wafer's float32 arithmetic on 16-bit inputs does. Intermediate results are not
rounded to cbfloat16 between operations. :func:`round_to_cbfloat16` is the rounding.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ._runtime import RUNTIME
from .backend import current_backend
from .errors import ConfigError

__all__ = ["CBFLOAT16", "autocast", "cast_floating", "compute_dtype",
           "enable_mixed_precision", "get_floating_point_dtype",
           "get_floating_point_dtype_str", "get_half_dtype", "get_half_dtype_str",
           "is_cbfloat16_tensor", "mixed_precision", "round_to_cbfloat16", "set_half_dtype"]

# The dtype that stands for each half dtype name; cbfloat16 has float16 as its proxy
# (what cstorch's set_half_dtype returns for it), and computes as CBFLOAT16 below.
_HALF_DTYPES = {"float16": jnp.float16, "bfloat16": jnp.bfloat16, "float32": jnp.float32,
                "cbfloat16": jnp.float16}


class _CBFloat16:
    """The compute "dtype" of cbfloat16: float32 arrays holding cbfloat16 values."""

    name = "cbfloat16"

    def __repr__(self) -> str:
        return "cbfloat16"


CBFLOAT16 = _CBFloat16()

# cbfloat16: 6 exponent bits (bias 31) and 9 mantissa bits, IEEE-754 conventions.
_CB16_MANTISSA = 9
_CB16_MIN_NORMAL = 2.0**-30
_CB16_QUANTUM = 2.0**-39  # the subnormal spacing
_CB16_MAX = (2.0 - 2.0**-_CB16_MANTISSA) * 2.0**31
_DROP = 23 - _CB16_MANTISSA  # float32 mantissa bits below cbfloat16's


def round_to_cbfloat16(x: jax.typing.ArrayLike) -> jax.Array:
    """Rounds ``x`` to the nearest cbfloat16 value, returned as float32.

    cbfloat16 has 1 sign, 6 exponent (bias 31) and 9 mantissa bits: normal values
    from 2**-30 to (2 - 2**-9) * 2**31 (about 4.3e9), subnormals down to 2**-39.
    Rounding is to nearest, ties to even; magnitudes that round past the largest
    finite value become infinity; NaN stays NaN. Every cbfloat16 value is a float32,
    so the result is exact in float32.

    Example:
      >>> float(cstorch.amp.round_to_cbfloat16(1.0 + 2.0**-10))  # a tie: to the even mantissa
      1.0
      >>> float(cstorch.amp.round_to_cbfloat16(1e5))   # float16 would overflow
      99968.0
    """
    x = jnp.asarray(x, jnp.float32)
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    lsb = (bits >> _DROP) & 1
    half = jnp.uint32((1 << (_DROP - 1)) - 1)
    rounded = (bits + half + lsb) & jnp.uint32(~((1 << _DROP) - 1) & 0xFFFFFFFF)
    normal = jax.lax.bitcast_convert_type(rounded, jnp.float32)
    # Below the smallest normal the spacing is fixed: round x / 2**-39 to an integer
    # (jnp.round rounds half to even); both scalings are exact powers of two.
    subnormal = jnp.round(x * (1.0 / _CB16_QUANTUM)) * _CB16_QUANTUM
    out = jnp.where(jnp.abs(x) < _CB16_MIN_NORMAL, subnormal, normal)
    out = jnp.where(jnp.abs(out) > _CB16_MAX, jnp.copysign(jnp.inf, x), out)
    return jnp.where(jnp.isnan(x), x, out)


def set_half_dtype(dtype: Any) -> Any:
    """Chooses the compute dtype of mixed precision and returns it.

    Args:
      dtype: ``"float16"`` (the wafer's default), ``"bfloat16"``, ``"cbfloat16"``
        (emulated, see the module docs; the returned proxy is float16, as cstorch's),
        ``"float32"`` (mixed precision off, a cerebrax extension), or the matching
        numpy / JAX / torch dtype.

    Example:
      >>> import cerebrax as cstorch
      >>> cstorch.amp.set_half_dtype("bfloat16")
      dtype(bfloat16)
    """
    name = _dtype_name(dtype)
    if name not in _HALF_DTYPES:
        raise ConfigError(
            f"set_half_dtype() expects one of {sorted(_HALF_DTYPES)} (or the matching "
            f"numpy / JAX / torch dtype), got {dtype!r}."
        )
    RUNTIME.half_dtype = name
    RUNTIME.mixed_precision = None  # the choice of dtype decides again
    return jnp.dtype(_HALF_DTYPES[name])


def enable_mixed_precision(enable: bool = True) -> bool:
    """Turns mixed precision on or off on every backend and returns the new setting.

    On, models compute in the half dtype (:func:`get_half_dtype_str`, float16 unless
    chosen); off, in float32. Without a call the backend decides (on for CSX only).
    """
    if not isinstance(enable, bool):
        raise ConfigError(f"enable_mixed_precision() expects a bool, got {enable!r}.")
    RUNTIME.mixed_precision = enable
    return enable


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str):
        return dtype.lower().removeprefix("torch.")
    text = str(dtype)
    if text.startswith("torch."):
        return text.removeprefix("torch.")
    try:
        return jnp.dtype(dtype).name
    except TypeError:
        return text


def _as_cstorch_dtype(dtype: Any) -> Any:
    """``dtype`` as cstorch code expects it: a torch dtype under the cstorch alias
    (``cerebrax run``), where it goes to ``tensor.to(...)`` or ``torch.as_tensor``;
    the JAX dtype otherwise."""
    if not RUNTIME.cstorch_alias or type(dtype).__module__ == "torch":
        return dtype
    import torch

    return getattr(torch, jnp.dtype(dtype).name)


def get_half_dtype() -> Any:
    """The chosen half dtype (float16 when none was chosen; float16 for cbfloat16): a JAX
    dtype, or under the cstorch alias (``cerebrax run``) a torch dtype, as cstorch's."""
    return _as_cstorch_dtype(jnp.dtype(_HALF_DTYPES[get_half_dtype_str()]))


def get_half_dtype_str() -> str:
    """The name of the chosen half dtype (:func:`set_half_dtype`): ``"float16"`` (also
    when none was chosen), ``"bfloat16"``, ``"cbfloat16"`` or ``"float32"``."""
    return RUNTIME.half_dtype or "float16"


def get_floating_point_dtype(default: Any = jnp.float32) -> Any:
    """The dtype models compute in on the current backend: the half dtype (its proxy for
    cbfloat16) when mixed precision is on, else ``default``; a torch dtype under the
    cstorch alias (see :func:`get_half_dtype`)."""
    if mixed_precision():
        return get_half_dtype()
    return _as_cstorch_dtype(default if type(default).__module__ == "torch"
                             else jnp.dtype(default))


def get_floating_point_dtype_str(default: str = "float32") -> str:
    """Like :func:`get_floating_point_dtype`, by name (``"cbfloat16"`` included)."""
    dtype = compute_dtype()
    return default if dtype is None else dtype.name


def mixed_precision(backend: Any = None) -> bool:
    """Whether models compute in a half dtype on ``backend`` (the current one if None)."""
    return compute_dtype(backend) is not None


# The innermost autocast: its half dtype name ("float32" for autocast(enabled=False)) and
# whether torch's own autocast decides for torch code under it; None outside every
# autocast. A context variable: each thread has its own.
_AUTOCAST: contextvars.ContextVar[tuple[str, bool] | None] = contextvars.ContextVar(
    "cerebrax_autocast", default=None)

# The half dtypes torch's autocast takes (cbfloat16 has no torch dtype).
_TORCH_AUTOCAST_DTYPES = ("float16", "bfloat16")

MSG_GPU_AUTOCAST = """\
cstorch.amp.autocast() on the GPU backend computes a torch model's whole call in {dtype}
(its weights, buffers and inputs are cast at the call). torch's autocast on CUDA instead
casts per operation and keeps softmax, norms, reductions and losses in float32, so the
losses differ from a torch-on-CUDA run at {dtype}'s rounding. The CPU backend applies
torch's own autocast and matches torch eager."""


def compute_dtype(backend: Any = None, *, torch_model: bool = False) -> Any | None:
    """The dtype models compute in: a JAX dtype, :data:`CBFLOAT16`, or None for float32.

    ``torch_model``: the model is a torch module. Under an :class:`autocast` that is
    torch's own (CPU backend), such a model computes as torch's autocast decides, per
    operation, so its call casts nothing (None).
    """
    state = _AUTOCAST.get()
    if state is not None:
        name, by_torch = state
        if by_torch and torch_model:
            return None
        if torch_model and name != "float32":
            _warn_gpu_autocast(backend, name)
    else:
        name = _policy_name(backend)
    if name is None or name == "float32":
        return None
    return CBFLOAT16 if name == "cbfloat16" else jnp.dtype(_HALF_DTYPES[name])


def torch_autocast_state() -> tuple:
    """The CPU ``torch.autocast`` in effect (``("cpu", dtype)``), or ``()`` where none is
    (or torch is not loaded). Its casts are part of a torch model's graph."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_autocast_enabled("cpu"):
        return ()
    return ("cpu", torch.get_autocast_dtype("cpu"))


def _warn_gpu_autocast(backend: Any, name: str) -> None:
    if backend is None:
        backend = current_backend(raise_exception=False)
    if RUNTIME.warned.get("gpu autocast") or backend is None or not backend.is_gpu:
        return
    RUNTIME.warned["gpu autocast"] = True
    warnings.warn(MSG_GPU_AUTOCAST.format(dtype=name), UserWarning, stacklevel=4)


def _policy_name(backend: Any) -> str | None:
    """The half dtype name of the policy outside autocast, or None for float32."""
    name, enabled = RUNTIME.half_dtype, RUNTIME.mixed_precision
    if enabled is False:
        return None
    if enabled:
        return name if name not in (None, "float32") else "float16"
    if name is not None:
        return name
    if backend is None:
        backend = current_backend(raise_exception=False)
    return "float16" if backend is not None and backend.is_csx else None


class autocast(contextlib.ContextDecorator):
    """Model calls under it compute in the half dtype (or in float32 if disabled).

    On the CPU backend, where the half dtype is float16 or bfloat16, it is torch's own
    autocast, as cstorch's is: it enters ``torch.autocast("cpu", dtype)`` (where torch
    is loaded), so a torch model called under it, and the step's torch operations in
    it, cast per operation as torch eager does (matrix products in the half dtype, the
    ops of torch's float32 list in float32), and a torch model's outputs have the dtype
    torch gives them. A model that is a JAX function, and every model on the other
    backends (or at cbfloat16), computes its whole call in the half dtype instead: its
    weights, buffers and inputs are cast at the call and its outputs come back in
    float32. Outside, the precision policy applies (float32 on CPU and GPU unless mixed
    precision was turned on). ``autocast(enabled=False)`` computes in float32 even on
    CSX. Inside a traced step the setting is captured when the step is traced: it is
    part of the compiled graph. Also usable as a decorator.

    Args:
      dtype: the half dtype (a name or dtype, as :func:`set_half_dtype` takes); None
        uses :func:`get_half_dtype_str`.
      enabled: False computes in float32 under it.

    Example:
      >>> model = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> x = torch.full((2, 4), 0.1)
      >>> with cstorch.amp.autocast("bfloat16"):  # torch.autocast("cpu", torch.bfloat16)
      ...     half = model(x)
      >>> full = model(x)                         # outside: float32 (on CPU)
      >>> half.dtype, full.dtype                  # the linear layer's output, as in torch
      (dtype(bfloat16), dtype('float32'))
    """

    def __init__(self, dtype: Any = None, enabled: bool = True):
        if not isinstance(enabled, bool):
            raise ConfigError(f"autocast(enabled=...) expects a bool, got {enabled!r}.")
        name = None if dtype is None else _dtype_name(dtype)
        if name is not None and name not in _HALF_DTYPES:
            raise ConfigError(
                f"autocast(dtype=...) expects one of {sorted(_HALF_DTYPES)}, got {dtype!r}."
            )
        self.dtype, self.enabled = name, enabled
        self._entered: list[tuple[contextvars.Token, Any]] = []

    def __enter__(self) -> autocast:
        name = self.dtype or get_half_dtype_str()
        if name == "float32" and self.enabled:
            name = "float16"  # "float32" turns the policy off; autocast turns it on
        name = name if self.enabled else "float32"
        region = _torch_autocast(name)
        if region is not None:
            region.__enter__()
        self._entered.append((_AUTOCAST.set((name, region is not None)), region))
        return self

    def __exit__(self, *exc: Any) -> None:
        token, region = self._entered.pop()
        _AUTOCAST.reset(token)
        if region is not None:
            region.__exit__(*exc)


def _torch_autocast(name: str) -> Any:
    """The ``torch.autocast`` region an :class:`autocast` at ``name`` enters, or None
    where torch's autocast does not decide: torch is not loaded, the backend is not the
    CPU (CSX and GPU keep the whole-call policy), or the dtype is cbfloat16."""
    torch = sys.modules.get("torch")
    backend = current_backend(raise_exception=False)
    if torch is None or (backend is not None and not backend.is_cpu):
        return None
    if name == "float32":
        return torch.autocast("cpu", enabled=False)
    if name not in _TORCH_AUTOCAST_DTYPES:
        return None
    return torch.autocast("cpu", dtype=getattr(torch, name))


def cast_floating(tree: Any, dtype: Any) -> Any:
    """Casts the floating-point leaves of ``tree`` to ``dtype`` (:data:`CBFLOAT16`:
    rounds them to cbfloat16 values held in float32)."""
    cast: Callable[[jax.Array], jax.Array]
    if dtype is CBFLOAT16:
        cast = _round_cb16
    else:
        cast = functools.partial(_astype, dtype=dtype)
    return jax.tree.map(
        lambda x: cast(x)
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)
        else x,
        tree,
    )


def _astype(x: jax.Array, dtype: Any) -> jax.Array:
    return x.astype(dtype)


def _round_cb16(x: jax.Array) -> jax.Array:
    return round_to_cbfloat16(x.astype(jnp.float32))


def is_cbfloat16_tensor(tensor: Any) -> bool:
    """Whether ``tensor`` has cstorch's cbfloat16 dtype: never in cerebrax, whose
    cbfloat16 values are held in float32 arrays (see :func:`round_to_cbfloat16`), so
    code such as ``if is_cbfloat16_tensor(t): t = t.float()`` leaves them as they are."""
    del tensor
    return False
