"""Step closures: host code that runs after a step, on that step's materialized values.

A closure called inside a traced step turns its array arguments into extra outputs of
the step's program. A closure called between steps captures the arrays it is given.
Either way the call is queued and runs later, first in first out, with numpy values.

Inside a :class:`~cerebrax.data.DataExecutor` the queue runs one step behind: the
closures of step ``s`` run after step ``s + 1`` has been dispatched, so the device is
never idle while the host prints a loss. On checkpoint steps and on the final step the
queue is drained before the next step is dispatched, so checkpoint closures see the
state of their own step. Outside an executor a closure runs as soon as its step is done.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from . import _state
from .errors import StateError
from ._placement import readable

__all__ = ["checkpoint_closure", "step_closure"]

MSG_STALE_READ = """\
A step closure of step {step} read {name!r}, but the state has already moved on to a
later step: inside a DataExecutor, closures run one step behind so that printing never
stalls the device, and model or optimizer state can only be fetched on checkpoint steps.
Fix: read state in a @cstorch.checkpoint_closure (it runs on checkpoint steps and the
final step), e.g.

    @cstorch.checkpoint_closure
    def save_checkpoint(step):
        cstorch.save({{"model": model.state_dict()}}, f"checkpoint_{{step}}.mdl")

and choose the steps with DataExecutor(..., checkpoint_steps=N)."""


@dataclasses.dataclass
class _Entry:
    step: int
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    kind: str  # "step", "checkpoint" or "summary" (cerebrax.summaries)
    mark: int  # the queue's dispatch count when the values were produced


class ClosureQueue:
    """The process-wide FIFO of closures waiting for their step's values."""

    def __init__(self) -> None:
        self.pending: collections.deque[_Entry] = collections.deque()
        self.dispatches = 0  # traced steps dispatched so far
        self.last_outputs: list = []  # output arrays of the last traced step
        self._running: _Entry | None = None
        _state._READ_GUARDS.append(self._guard)

    def _guard(self, ref: _state.StateRef) -> None:
        entry = self._running
        if entry is not None and entry.mark != self.dispatches:
            raise StateError(MSG_STALE_READ.format(step=entry.step, name=ref.name))

    def put(self, entry: _Entry) -> None:
        self.pending.append(entry)

    def run_until(self, step: int | None, executor: Any | None) -> None:
        """Runs, in order, the queued closures of steps up to ``step`` (all if None)."""
        while self.pending and (step is None or self.pending[0].step <= step):
            entry = self.pending.popleft()
            if executor is not None and not executor._should_run(entry.step, entry.kind):
                continue
            self._run(entry)

    def _run(self, entry: _Entry) -> None:
        if entry.kind == "summary" and _current_executor() is None:
            return  # summaries go to the executor's writer: none here, fetch nothing
        # Host sync point: materializing the arguments waits for their step.
        args, kwargs = to_host((entry.args, entry.kwargs))
        self._running = entry
        try:
            entry.fn(*args, **kwargs)
        finally:
            self._running = None

    def clear(self) -> None:
        self.pending.clear()

    def running_step(self) -> int | None:
        """The step of the closure running now (None when no closure runs)."""
        return None if self._running is None else self._running.step


QUEUE = ClosureQueue()


def to_host(tree: Any) -> Any:
    """``tree`` with every JAX array replaced by a numpy array (waits for the values).

    On a mesh that spans processes, a step's closure arguments are replicated and read
    from this process's devices; an array split over several processes is gathered
    first, which every process does, since every process runs the same closures.
    """
    leaves, treedef = jax.tree.flatten(tree)
    leaves = [readable(x) for x in leaves]
    arrays = [x for x in leaves if isinstance(x, jax.Array)]
    if len(arrays) > 1:
        for x in arrays:
            x.copy_to_host_async()  # start every transfer before waiting on the first
    return jax.tree.unflatten(
        treedef, [np.asarray(x) if isinstance(x, jax.Array) else x for x in leaves])


# The DataExecutors whose loops are running (innermost last); owned by cerebrax.data.
ACTIVE_EXECUTORS: list = []


def _current_executor():
    return ACTIVE_EXECUTORS[-1] if ACTIVE_EXECUTORS else None


def _state_leaf_ids() -> set[int]:
    return {id(leaf) for ref in _state.live_refs() for leaf in jax.tree.leaves(ref._value)}


def _protect_from_donation(tree: Any) -> Any:
    """Copies arrays that are current state: the next step donates (deletes) those."""
    arrays = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
    outputs = QUEUE.last_outputs
    if all(any(x is out for out in outputs) for x in arrays):
        return tree  # the usual case: the step's own outputs, which are never donated
    ids = _state_leaf_ids()
    return jax.tree.map(
        lambda x: x.copy() if isinstance(x, jax.Array) and id(x) in ids else x, tree
    )


def _enqueue_or_run(fn: Callable[..., Any], args: tuple, kwargs: dict, kind: str) -> None:
    ctx = _state.active_context()
    if ctx is not None:
        ctx.add_closure(fn, args, kwargs, kind)
        return
    executor = _current_executor()
    if executor is None:
        if kind == "summary":
            return  # no executor, no writer: summaries are dropped
        if kind == "checkpoint":
            raise StateError(
                "Cannot fetch a checkpoint outside of an execution context. Call "
                "checkpoint closures inside the loop over a cstorch.utils.data."
                "DataExecutor (or over a cstorch DataLoader), where checkpoint steps "
                "are known."
            )
        args, kwargs = to_host((args, kwargs))
        fn(*args, **kwargs)
        return
    step = executor.iteration
    if kind != "step" and not executor._should_run(step, kind):
        return
    args, kwargs = _protect_from_donation((args, kwargs))
    QUEUE.put(_Entry(step, fn, args, kwargs, kind, QUEUE.dispatches))


def step_closure(fn: Callable[..., Any]) -> Callable[..., None]:
    """Marks ``fn`` as a step closure: it runs after the step with numpy values.

    Inside a traced step, the closure's array arguments become outputs of the step
    and ``fn`` runs once the step is done, in call order. Non-array arguments keep
    the value they had when the step was traced (the graph is captured once).

    Example:
      >>> import cerebrax as cstorch
      >>> @cstorch.step_closure
      ... def print_loss(loss, step):
      ...     print(f"step {step}: loss {loss.item():.3f}")
      >>> print_loss(np.float32(0.5), 3)   # outside a step it runs right away
      step 3: loss 0.500
    """

    @functools.wraps(fn)
    def closure(*args: Any, **kwargs: Any) -> None:
        _enqueue_or_run(fn, args, kwargs, "step")

    closure.__cerebrax_closure__ = "step"  # type: ignore[attr-defined]
    return closure


def checkpoint_closure(fn: Callable[..., Any]) -> Callable[..., None]:
    """Marks ``fn`` as a checkpoint closure: it runs on checkpoint steps and the last.

    Checkpoint steps come from ``DataExecutor(checkpoint_steps=k)`` (0-based steps
    ``k-1, 2k-1, ...``) and always include the final step. On other steps the call is
    skipped. Model and optimizer state read inside is that of the closure's own step.
    Outside an executor the call raises.
    """

    @functools.wraps(fn)
    def closure(*args: Any, **kwargs: Any) -> None:
        _enqueue_or_run(fn, args, kwargs, "checkpoint")

    closure.__cerebrax_closure__ = "checkpoint"  # type: ignore[attr-defined]
    return closure
