"""Step closures: host code that runs after a step, on that step's materialized values.

A closure called inside a traced step turns its array arguments into extra outputs of
the step's program. A closure called between steps captures the arrays it is given.
Either way the call is queued and runs later, first in first out, with numpy values.

Inside a :class:`~cerebrax.data.DataExecutor` the queue runs one step behind: the
closures of step ``s`` run after step ``s + 1`` has been dispatched, so the device is
never idle while the host prints a loss. On checkpoint steps and on the final step the
queue is drained before the next step is dispatched, so checkpoint closures see the
state of their own step. Outside an executor a closure runs as soon as its step is done.

This module owns a closure's whole life, behind a few calls:

- :func:`record_closure` (a decorated closure is called): inside a traced step the call is
  noted by the trace context and becomes a :class:`ClosureCall`; between steps its
  values are captured and queued (or run at once outside an executor);
- :func:`split_arguments` (the step's program is built): the array arguments of each
  :class:`ClosureCall` become outputs of the program;
- :func:`after_dispatch` (a step was dispatched): the closures of that step are queued
  with the step's arrays;
- :func:`executor_scope` (a DataExecutor loop runs) and :func:`drain` (between steps
  and at the end): closures run in order, up to a step.

An executor takes part through a small protocol: its ``iteration`` (the 0-based step),
``should_run(step, kind)`` and ``note_output(output)``. The queue itself is part of
:data:`cerebrax._runtime.RUNTIME`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import jax

from .._filters import is_torch_tensor
from .._placement import to_host
from .._runtime import RUNTIME
from .._tree import Skeleton, TorchLeaf, combine, partition
from ..errors import StateError
from . import _state
from ._active_context import active_context
from ._interop import to_torch

__all__ = ["ClosureCall", "after_dispatch", "checkpoint_closure", "current_executor",
           "drain", "executor_scope", "record_closure", "running_step", "split_arguments",
           "step_closure"]

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



MSG_CHECKPOINT_OUTSIDE = """\
Cannot fetch a checkpoint outside of an execution context. Call checkpoint closures
inside the loop over a cstorch.utils.data.DataExecutor (or over a cstorch DataLoader),
where checkpoint steps are known.{detail}"""


class Executor(Protocol):
    """What a loop that runs steps offers the closures (``DataExecutor`` does)."""

    iteration: int  # the 0-based step running now

    def should_run(self, step: int, kind: str) -> bool: ...
    def note_output(self, output: Any) -> None: ...


@dataclasses.dataclass
class _Entry:
    step: int
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    kind: str  # "step", "checkpoint" or "summary" (cerebrax.summaries)
    mark: int  # the dispatch count when the values were produced


@dataclasses.dataclass
class ClosureCall:
    """A closure called inside a traced step, as recorded while the step is traced.

    ``arguments`` is what the trace context keeps of ``(args, kwargs)``: it gives them
    back, with tracers, when the program's outputs are chosen (:func:`split_arguments`).
    """

    fn: Callable[..., Any]
    kind: str
    arguments: Any
    skeleton: Skeleton | None = None  # ``(args, kwargs)`` but for their arrays
    first: int = 0  # where this call's arrays start among the closure outputs


# ---- recording ------------------------------------------------------------------------

def record_closure(fn: Callable[..., Any], args: tuple, kwargs: dict, kind: str) -> None:
    """A closure of ``kind`` ("step", "checkpoint" or "summary") was called."""
    ctx = active_context()
    if ctx is not None:
        ctx.add_closure(fn, args, kwargs, kind)
        return
    executor = current_executor()
    args, kwargs = _torch_arguments((args, kwargs))
    if executor is None:
        if kind == "summary":
            return  # no executor, no writer: summaries are dropped
        if kind == "checkpoint" and RUNTIME.dispatches:
            raise StateError(MSG_CHECKPOINT_OUTSIDE.format(detail=""))
        # A step closure, or a checkpoint closure at cstorch's "pre-initial step" (no step
        # has run yet: Model Zoo's save_initial_checkpoint), runs now on the values now.
        args, kwargs = _materialize((args, kwargs))
        fn(*args, **kwargs)
        return
    step = executor.iteration
    if kind != "step" and not executor.should_run(step, kind):
        return
    args, kwargs = _protect_from_donation((args, kwargs))
    RUNTIME.closures.append(_Entry(step, fn, args, kwargs, kind, RUNTIME.dispatches))


def split_arguments(calls: list[ClosureCall], unroute: Callable[[Any], Any]) -> list:
    """The array arguments of ``calls``, in order, which become the program's outputs.

    ``unroute(call.arguments)`` gives back ``(args, kwargs)`` with tracers; each call
    remembers where its arrays are, to rebuild its arguments after the step.
    """
    arrays: list = []
    for call in calls:
        found, call.skeleton = partition(unroute(call.arguments))
        call.first = len(arrays)
        arrays.extend(found)
    return arrays


# ---- after a step ---------------------------------------------------------------------

def after_dispatch(calls: list[ClosureCall], closure_arrays: list, outputs: list,
                   result: Any, step_name: str) -> None:
    """A traced step was dispatched: queue its closures with their arrays.

    ``outputs`` are the step's output arrays (never donated, so closures may hold
    them); ``result`` is what the step returned, which the executor may show.
    """
    RUNTIME.dispatches += 1
    RUNTIME.last_outputs = outputs
    executor = current_executor()
    for call in calls:
        args, kwargs = combine(closure_arrays[call.first:], call.skeleton, torch=TorchLeaf)
        if executor is None:
            if call.kind == "checkpoint":
                raise StateError(MSG_CHECKPOINT_OUTSIDE.format(
                    detail=f" The traced step `{step_name}` calls a checkpoint closure "
                    "but runs outside a DataExecutor."))
            _run(_Entry(-1, call.fn, args, kwargs, call.kind, RUNTIME.dispatches))
        else:
            RUNTIME.closures.append(_Entry(executor.iteration, call.fn, args, kwargs,
                                           call.kind, RUNTIME.dispatches))
    if executor is not None:
        executor.note_output(result)


# ---- running ----------------------------------------------------------------------------

@contextlib.contextmanager
def executor_scope(executor: Executor) -> Iterator[None]:
    """The block where ``executor``'s loop runs steps; closures left over are dropped.

    An earlier loop that an exception abandoned leaves its scope open: entering a new
    one drops its closures.
    """
    if RUNTIME.executors:
        RUNTIME.executors.clear()
        RUNTIME.closures.clear()
    RUNTIME.executors.append(executor)
    try:
        yield
    finally:
        if RUNTIME.executors and RUNTIME.executors[-1] is executor:
            RUNTIME.executors.pop()


def current_executor() -> Executor | None:
    """The executor whose loop is running (innermost), or None."""
    return RUNTIME.executors[-1] if RUNTIME.executors else None


def drain(step: int | None = None) -> None:
    """Runs, in order, the queued closures of steps up to ``step`` (all if None).

    A closure that raises ends the run's closures: the queue is dropped before the
    error propagates, so the executor's cleanup (which drains what is left) never
    calls that closure again for a later step and never chains a second copy of the
    error onto the first.
    """
    executor = current_executor()
    queue = RUNTIME.closures
    while queue and (step is None or queue[0].step <= step):
        entry = queue.popleft()
        if executor is not None and not executor.should_run(entry.step, entry.kind):
            continue
        try:
            _run(entry)
        except BaseException:
            queue.clear()
            raise


def running_step() -> int | None:
    """The step of the closure running now (None when no closure runs)."""
    entry = RUNTIME.running_closure
    return None if entry is None else entry.step


def _materialize(tree: Any) -> Any:
    """``tree`` on the host: numpy arrays, and torch tensors where the step had them."""
    arrays, skeleton = partition(tree)
    host = to_host(arrays)
    if RUNTIME.cstorch_alias and "torch" in sys.modules:
        # cstorch code gets torch tensors for every value of a step (the learning rate
        # of a param group too), as cstorch's closures do: never numpy.
        host = [_as_torch(x, d) for x, d in zip(host, skeleton.torch_dtypes)]
        return combine(host, skeleton)
    return combine(host, skeleton, torch=to_torch)


def _as_torch(x: Any, dtype: Any) -> Any:
    """The host array ``x`` as a torch tensor; a dtype torch lacks stays numpy."""
    try:
        return to_torch(x, dtype)
    except (TypeError, ValueError):
        return x


def _run(entry: _Entry) -> None:
    if entry.kind == "summary" and current_executor() is None:
        return  # summaries go to the executor's writer: none here, fetch nothing
    # Host sync point: materializing the arguments waits for their step.
    args, kwargs = _materialize((entry.args, entry.kwargs))
    RUNTIME.running_closure = entry
    try:
        entry.fn(*args, **kwargs)
    finally:
        RUNTIME.running_closure = None


def _guard_stale_read(ref: _state.StateRef) -> None:
    """A closure running behind its step may not read state that moved on."""
    entry = RUNTIME.running_closure
    if entry is not None and entry.mark != RUNTIME.dispatches:
        raise StateError(MSG_STALE_READ.format(step=entry.step, name=ref.name))


_state.add_read_guard(_guard_stale_read)


def _torch_arguments(tree: Any) -> Any:
    """``tree`` with a step's torch tensors (what a step returned) as :class:`TorchLeaf`:
    the closure gets them as host torch tensors, as it does when called in the step."""
    if "torch" not in sys.modules:
        return tree
    return jax.tree.map(
        lambda x: TorchLeaf(x.__jax_array__(), x.dtype)
        if is_torch_tensor(x) and hasattr(x, "__jax_array__") else x,
        tree, is_leaf=is_torch_tensor)


def _protect_from_donation(tree: Any) -> Any:
    """Copies arrays that are current state: the next step donates (deletes) those."""
    arrays = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
    outputs = RUNTIME.last_outputs
    if all(any(x is out for out in outputs) for x in arrays):
        return tree  # the usual case: the step's own outputs, which are never donated
    ids = {id(leaf) for ref in _state.live_refs() for leaf in jax.tree.leaves(ref.stored)}
    return jax.tree.map(
        lambda x: x.copy() if isinstance(x, jax.Array) and id(x) in ids else x, tree
    )


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
        record_closure(fn, args, kwargs, "step")

    closure.__cerebrax_closure__ = "step"  # type: ignore[attr-defined]
    return closure


def checkpoint_closure(fn: Callable[..., Any]) -> Callable[..., None]:
    """Marks ``fn`` as a checkpoint closure: it runs on checkpoint steps and the last.

    Checkpoint steps come from ``DataExecutor(checkpoint_steps=k)`` (0-based steps
    ``k-1, 2k-1, ...``) and always include the final step. On other steps the call is
    skipped. Model and optimizer state read inside is that of the closure's own step.
    Before any step has run (cstorch's pre-initial step, e.g. saving the initial
    checkpoint) the call runs at once; outside an executor after that it raises.
    """

    @functools.wraps(fn)
    def closure(*args: Any, **kwargs: Any) -> None:
        record_closure(fn, args, kwargs, "checkpoint")

    closure.__cerebrax_closure__ = "checkpoint"  # type: ignore[attr-defined]
    return closure
