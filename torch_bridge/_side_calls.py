"""Calls that a module's ``forward`` makes for their effect, carried out of the graph.

Model Zoo's models update cstorch metrics inside ``forward``
(``self.accuracy_metric(labels=..., predictions=...)``). An exported graph is a pure
function of its inputs, so such a call cannot run inside it: while ``forward`` is
exported, :func:`record_side_call` notes the call and the tensors it was given; the
tensors become extra outputs of the graph, and each time the graph runs,
:class:`SideCalls` makes the call again on their values (JAX arrays), after the
graph's own outputs are computed. A metric then updates from the values of every
step, as when the step's own code calls it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

from cerebrax._tree import Skeleton, combine, partition

from ._tensor import refuse_in_direct

__all__ = ["SideCalls", "exporting_side_calls", "record_side_call"]

_RECORDING: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "torch_bridge_side_calls", default=None)


def record_side_call(fn: Callable, args: tuple, kwargs: dict) -> bool:
    """While a module's ``forward`` is exported, records ``fn(*args, **kwargs)`` to run
    on the graph's values each time the graph runs, and returns True; elsewhere it
    records nothing and returns False (the caller then runs the call itself)."""
    refuse_in_direct(f"a call made for its effect ({getattr(fn, '__qualname__', fn)})")
    calls = _RECORDING.get()
    if calls is None:
        return False
    calls.append((fn, args, kwargs))
    return True


@dataclasses.dataclass(frozen=True)
class _Call:
    fn: Callable
    skeleton: Skeleton  # (args, kwargs) but for their tensors, which are graph outputs

    @property
    def count(self) -> int:
        """How many graph outputs it takes."""
        return len(self.skeleton.torch_dtypes)


@dataclasses.dataclass(frozen=True)
class SideCalls:
    """The side calls of one exported graph, and how its outputs split."""

    calls: tuple[_Call, ...] = ()

    @property
    def count(self) -> int:
        """How many of the graph's flat user outputs are the calls' arguments."""
        return sum(c.count for c in self.calls)

    def out_spec(self, spec: Any) -> Any:
        """The module's own output structure, from the graph's (``(out, [values])``)."""
        if not self.calls:
            return spec
        # torch 2.13 deprecates children_specs for child(i), which older torch lacks.
        return spec.child(0) if hasattr(spec, "child") else spec.children_specs[0]

    def run(self, outputs: list) -> list:
        """Makes the calls on the trailing values of ``outputs``; returns the rest."""
        if not self.calls:
            return outputs
        own, values = outputs[: len(outputs) - self.count], iter(outputs[-self.count:])
        for call in self.calls:
            args, kwargs = combine(values, call.skeleton)
            call.fn(*args, **kwargs)
        return own


@contextlib.contextmanager
def exporting_side_calls(module: torch.nn.Module) -> Iterator[list[SideCalls]]:
    """While the block exports ``module``, its ``forward`` records side calls and
    returns ``(out, [their tensors])`` where it made any. The block's value is a list
    that holds the :class:`SideCalls` once the block has run."""
    recorded: list = []
    described: list[SideCalls] = []
    original = module.forward
    own = "forward" in module.__dict__

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        recorded.clear()  # the last trace of forward is the graph
        token = _RECORDING.set(recorded)
        try:
            out = original(*args, **kwargs)
        finally:
            _RECORDING.reset(token)
        if not recorded:
            return out
        tensors = []
        for _, call_args, call_kwargs in recorded:
            tensors += _partition(call_args, call_kwargs)[0]
        return out, tensors

    module.forward = forward
    try:
        yield described
    finally:
        if own:
            module.forward = original
        else:
            del module.forward
    calls = [_Call(fn, _partition(call_args, call_kwargs)[1])
             for fn, call_args, call_kwargs in recorded]
    described.append(SideCalls(tuple(calls)))


def _partition(args: tuple, kwargs: dict) -> tuple[list, Skeleton]:
    """A call's tensors, and the rest (torch's pytree: torch's containers too)."""
    return partition((args, kwargs),
                     lambda x: (x, x.dtype) if isinstance(x, torch.Tensor) else None,
                     flatten=pytree.tree_flatten)
