"""The active trace context: what the rest of cerebrax may ask of it, and how it is found.

While ``@cstorch.trace`` builds a step's program, one trace context is active
(:class:`cerebrax._step.TraceContext`); :func:`active_context` returns it, or None outside a
traced step. :class:`ActiveContext` declares everything code outside the context's own
module uses of it, by group. The concrete class satisfies it (tests/trace), and
tests/test_layering.py checks that code elsewhere uses no other member of a value
obtained from :func:`active_context` (or annotated with this type), writes none of its
fields, and reads none of its private ones.

This module imports nothing else of cerebrax at run time: every module of the folder may
use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._runtime import RUNTIME

if TYPE_CHECKING:
    import greenlet
    import jax

    from ._grad_regions import Region
    from ._state import Parameter, StateRef
    from ._trace_context import StepRecord
    from .traced import TracedStep

__all__ = ["ActiveContext", "Bookkeeping", "Closures", "Gradients", "Program", "StateAccess",
           "TorchCode", "active_context", "tracing"]


class StateAccess(Protocol):
    """Every read and write of a registered slot in the step (``StateRef.value`` goes
    through these). After ``skip_writes_unless(flag)``, a write to a skippable slot
    (optimizer and scheduler state) keeps the old value where ``flag`` is False (a grad
    scaler's overflow skip); torch code's own writes to a parameter pass
    ``skippable=False`` and are kept."""

    def read(self, ref: StateRef) -> Any: ...
    def write(self, ref: StateRef, value: Any, *, skippable: bool = True) -> None: ...
    def skip_writes_unless(self, flag: jax.Array) -> None: ...


class Gradients(Protocol):
    """The marked loss, and each differentiated parameter's gradient once backward has run
    (``set_grad`` is the one way a gradient is written; ``user_grad`` is ``p.grad`` as the
    step's code sees it). ``deferred`` lists the gradient-consuming calls recorded so far,
    replayed after the backward pass."""

    loss: jax.Array | None
    deferred: list

    @property
    def has_grads(self) -> bool: ...
    @property
    def after_backward(self) -> bool: ...
    def grad(self, p: Parameter) -> Any: ...
    def grad_or_none(self, p: Parameter) -> Any: ...
    def user_grad(self, p: Parameter) -> Any: ...
    def set_grad(self, p: Parameter, g: Any) -> None: ...


class Bookkeeping(Protocol):
    """The step being traced, the compiled models it calls, and this trace's records of
    the grad scalers and optimizers (by key; they go with the trace)."""

    step: TracedStep
    models_used: list

    def note_model(self, model: Any) -> None: ...
    def record(self, key: Any, default: Any = None) -> Any: ...
    def set_record(self, key: Any, value: Any) -> None: ...
    def records(self) -> list[tuple[Any, Any]]: ...


class Closures(Protocol):
    """A step closure's call: its arrays are routed out of the differentiated pass and
    become outputs of the program."""

    def add_closure(self, fn: Callable, args: tuple, kwargs: dict, kind: str) -> None: ...


class TorchCode(Protocol):
    """Torch code in the step (:mod:`cerebrax._step._grad_regions`): the greenlet the step's
    code runs in (None before it runs), the torch tensors made in the forward pass so far,
    and the regions of ``torch.autograd.grad`` with the state they change."""

    worker: greenlet.greenlet | None
    made: list
    regions: list

    def resume(self, value: Any = None) -> Any: ...
    def suspend(self, message: Any) -> Any: ...
    def open_region(self, region: Region) -> None: ...
    def region_snapshot(self) -> dict: ...
    def region_changes(self, snapshot: dict) -> dict: ...
    def restore_region_changes(self, changes: dict) -> None: ...
    def replace_loss(self, loss: jax.Array) -> None: ...


class Program(Protocol):
    """What the traced step that made the context does with it: runs the step's code,
    then takes the frozen record of the trace."""

    def run(self, fn: Callable, args: tuple, kwargs: dict) -> Any: ...
    def finish(self, refs: list[StateRef], outputs: Any) -> StepRecord: ...


@runtime_checkable
class ActiveContext(StateAccess, Gradients, Bookkeeping, Closures, TorchCode, Program,
                    Protocol):
    """The trace context of the step being traced, as the rest of cerebrax uses it: the
    members of the groups above, and no others."""


def active_context() -> ActiveContext | None:
    """The trace context of the step being traced, or None outside a traced step."""
    contexts = RUNTIME.trace_contexts
    return contexts[-1] if contexts else None


@contextlib.contextmanager
def tracing(context: ActiveContext) -> Iterator[None]:
    """Sends every read and write of state to ``context`` while the block runs."""
    RUNTIME.trace_contexts.append(context)
    try:
        yield
    finally:
        RUNTIME.trace_contexts.pop()
