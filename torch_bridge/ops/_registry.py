"""The op registry: one small JAX function per ATen overload.

A lowering receives the ATen op's arguments with every tensor replaced by a JAX array
(other arguments stay as torch passes them: ints, lists, ``torch.dtype`` values) and
returns what the op returns (a JAX array, or a tuple of them). Lowerings registered with
``random=...`` receive a ``jax.random`` key as their first argument (one split per graph
node), or None where the predicate says this call is not random.

Example:
  A lowering for an op of one's own library (``torch.library.custom_op``); one
  registered for an ATen op replaces the built-in lowering for the whole process:

  >>> import torch, jax.numpy as jnp
  >>> from torch_bridge import lowering
  >>> @torch.library.custom_op("mylib::hardswish", mutates_args=())
  ... def hardswish(x: torch.Tensor) -> torch.Tensor:
  ...     return x * (x + 3.0).clamp(0.0, 6.0) / 6.0
  >>> @lowering(torch.ops.mylib.hardswish.default)
  ... def hardswish_lowering(x):
  ...     return x * jnp.clip(x + 3.0, 0.0, 6.0) / 6.0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Lowering", "is_random", "lookup", "lowered_ops", "lowering"]

RandomSpec = bool | Callable[..., bool]


@dataclasses.dataclass(frozen=True)
class Lowering:
    """A registered lowering: the JAX function and whether it consumes a PRNG key.

    ``random`` is a bool, or a predicate called with the op's arguments as they appear
    in the graph (tensors as graph nodes, the rest as values) that says whether this
    call is random (``native_dropout`` in eval mode is not).
    """

    op: Any
    fn: Callable[..., Any]
    random: RandomSpec = False


_LOWERINGS: dict[Any, Lowering] = {}


def lowering(*ops: Any, random: RandomSpec = False) -> Callable[[Callable], Callable]:
    """Registers the decorated function as the JAX lowering of every op in ``ops``.

    Args:
      *ops: ATen overloads (``torch.ops.aten.add.Tensor``) or other graph call targets,
        or the name of an overload in a namespace another library registers when it is
        imported (``"transformers.grouped_mm_fallback.default"``, as ``str(op)`` gives it),
        so that lowering it does not import that library.
      random: True if the function takes a PRNG key as its first argument, or a
        predicate of the op's graph arguments saying so per call.

    Returns:
      The decorator; it returns the function unchanged. A later registration of the
      same op replaces the earlier one (this is how a user overrides a lowering).
    """
    if not ops:
        raise TypeError("lowering() needs at least one op, e.g. torch.ops.aten.relu.default.")
    for op in ops:
        if isinstance(op, str) and op.count(".") < 2:
            raise TypeError(f"lowering() takes op names as 'namespace.op.overload', got {op!r}.")
        if isinstance(op, torch._ops.OpOverloadPacket):
            raise TypeError(
                f"lowering() takes op overloads, got the packet {op}; name the overload, "
                f"e.g. {op}.default (its overloads: {op.overloads()})."
            )

    def register(fn: Callable) -> Callable:
        for op in ops:
            _LOWERINGS[op] = Lowering(op, fn, random)
        return fn

    return register


def lookup(op: Any) -> Lowering | None:
    """The lowering registered for ``op`` (or for its name), or None."""
    entry = _LOWERINGS.get(op)
    if entry is None and isinstance(op, torch._ops.OpOverload):
        entry = _LOWERINGS.get(str(op))
    return entry


def is_random(entry: Lowering, args: tuple, kwargs: dict) -> bool:
    """Whether a call of ``entry`` with these graph arguments consumes a PRNG key."""
    if callable(entry.random):
        return bool(entry.random(*args, **kwargs))
    return bool(entry.random)


def lowered_ops() -> list[str]:
    """Names of the ATen overloads that have a lowering, sorted."""
    return sorted(str(op) for op in _LOWERINGS if isinstance(op, (torch._ops.OpOverload, str)))
