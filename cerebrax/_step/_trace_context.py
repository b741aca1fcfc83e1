"""The trace context: where a traced step's reads and writes of state go.

While ``@cstorch.trace`` builds its program, one :class:`TraceContext` is active. Every
registered state slot reads and writes through it, so the imperative step becomes a pure
function of the state. The context runs the step under ``jax.vjp`` with respect to the
parameters that optimizers hold: ``cstorch.backward(loss)`` marks the loss, and calls
that consume gradients (decorated with :func:`deferrable`) are recorded while the
forward pass runs and replayed, in program order, once the gradients exist. Values
computed in the forward pass that must outlive it (state updates, the step's outputs,
closure and deferred-call arguments) leave the differentiated function as auxiliary
output.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import greenlet
import jax
import jax.numpy as jnp

from .._filters import is_torch_tensor
from .._tree import Skeleton, combine, jax_array, partition
from ..errors import StateError
from . import _closures, _grad_regions, _state
from ._active_context import ActiveContext, active_context
from ._grad_regions import SUSPENDED
from ._interop import as_jax, torch_to_jax

if TYPE_CHECKING:
    from .traced import TracedStep

__all__ = ["DeferredValue", "StepRecord", "TraceContext", "backward", "context_with_grads", "deferrable",
           "deferrable_function", "with_jax_gradients"]


class DeferredValue:
    """The result of a call that runs after the backward pass, e.g. a gradient norm.

    Inside a traced step, calls that consume gradients run once the gradients exist.
    Their result can be returned from the step or passed to a step closure; it
    cannot be computed with inside the step.
    """

    __slots__ = ("what", "_value", "_resolved")

    def __init__(self, what: str):
        self.what = what
        self._value: Any = None
        self._resolved = False

    def resolve(self, value: Any) -> None:
        """Sets the result, once the call has run after the backward pass (cerebrax's
        own machinery calls it)."""
        self._value, self._resolved = value, True

    @property
    def value(self) -> Any:
        """The result of the call; before the call has run, it raises
        :class:`~cerebrax.errors.StateError`."""
        if not self._resolved:
            raise StateError(
                f"The result of {self.what} is only known after the backward pass. "
                "Return it from the step or pass it to a step closure; do not compute "
                "with it inside the step."
            )
        return self._value

    def __jax_array__(self) -> jax.Array:
        return jnp.asarray(self.value)

    def __repr__(self) -> str:
        return f"DeferredValue({self.what})"


@dataclasses.dataclass
class _Routed:
    """A pytree whose arrays travel separately (out of the differentiated pass): they are
    ``aux[first:]``, in the places of ``skeleton``."""

    skeleton: Skeleton | None
    first: int = 0
    inline: Any = None  # set when the tree was not routed (built after the forward)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What one trace of a step produced (:meth:`TraceContext.finish`).

    Attributes:
      values: each state slot's value after the step, in the order the slots were asked.
      outputs: what the step's function returned (deferred values resolved).
      closures: the step closures called, in order; each knows where its arrays are.
      closure_arrays: the array arguments of those calls, outputs of the program.
      models: the compiled models the step called.
    """

    values: tuple
    outputs: Any
    closures: tuple
    closure_arrays: tuple
    models: tuple


class TraceContext:
    """The state of one trace of a step: where every read and write of state goes.

    Args:
      step: the traced step being traced.
      refs, values: every state slot of the step's program, and its value (a tracer).
      backend: the backend the program is built for.
      differentiated: the parameters the step differentiates, in order.
      aliases: ``(original, compiled parameter)`` pairs, the torch parameters that
        compiled parameters stand for (:func:`cerebrax._step.parameter_aliases`): torch
        code in the step reads their values, sets their ``.grad`` and runs their hooks.
    """

    def __init__(self, step: TracedStep, refs: list[_state.StateRef], values: list, *,
                 backend: Any, differentiated: list[_state.Parameter],
                 aliases: list[tuple[Any, _state.Parameter]]):
        self.step = step
        self.values: dict[_state.StateRef, Any] = dict(zip(refs, values))
        self.backend = backend
        self._differentiated = differentiated
        self._aliases = list(aliases)
        self.phase = "forward"
        self.diff: dict[_state.Parameter, Any] = {}
        self.loss: jax.Array | None = None
        # One value per differentiated parameter, written only by set_grad (and kept
        # equal to the original torch parameter's .grad while torch code runs).
        self._grads: dict[_state.Parameter, Any] | None = None
        self.deferred: list[tuple[Callable, _Routed, DeferredValue]] = []
        self.written: dict[_state.StateRef, None] = {}
        self.closures: list[_closures.ClosureCall] = []
        self.aux: list = []
        self.aux_out: list = []
        self.models_used: list = []
        self._condition: jax.Array | None = None  # skippable writes happen where True
        self._records: dict = {}  # per-step bookkeeping of grad scalers and optimizers
        # Torch-native steps (see run): the step's code runs in this greenlet, and the
        # original torch parameters whose .grad holds a gradient after backward.
        self.worker: greenlet.greenlet | None = None
        self.torch_grads: dict[_state.Parameter, Any] = {}
        self._torch_code = False  # True while torch code runs after loss.backward()
        self._jax_code = 0  # > 0 inside an optimizer's own step (see with_jax_gradients)
        # torch.autograd.grad regions (cerebrax._step._grad_regions), and the torch tensors
        # made in the forward pass so far (weak references).
        self.regions: list = []
        self.made: list = []
        # The torch function mode of live torch parameters while the step's code runs
        # (None without compiled torch parameters): see _live_torch_parameters.
        self.live: Any = None

    # ---- state -----------------------------------------------------------------
    def read(self, ref: _state.StateRef) -> Any:
        if self.phase == "forward" and ref in self.diff:
            return self.diff[ref]
        try:
            return self.values[ref]
        except KeyError:
            ref.check_generation()
            raise StateError(
                f"{ref.name!r} is not part of the state of the traced step "
                f"`{self.step.__name__}`: it was created after the step was first "
                "called. Create all models, optimizers and metrics before the first step."
            ) from None

    def write(self, ref: _state.StateRef, value: Any, *, skippable: bool = True) -> None:
        """Sets ``ref``'s value in this step. ``skippable=False``: a write that a step
        skipped by loss scaling keeps (torch code's own writes; only the update is
        skipped)."""
        old = self.read(ref)
        value = jax.tree.map(jnp.asarray, value)
        problem = _state.same_structure(old, value)
        if problem is not None:
            raise StateError(
                f"A traced step wrote a value with {problem} to {ref.name!r}; state keeps "
                "its structure, shapes and dtypes in a static graph."
            )
        if self._condition is not None and ref.skippable and skippable:
            value = jax.tree.map(lambda n, o: jnp.where(self._condition, n, o), value, old)
        if self.phase == "forward":
            self.written[ref] = None
            primal = self.diff.get(ref)
            if primal is not None:
                # A differentiated parameter written before the backward pass (``p.data``,
                # or in place under ``no_grad``) stays a leaf, as in torch: later reads see
                # the new value, and their gradient flows to the parameter.
                self.diff[ref] = jax.tree.map(_leaf_at, primal, value)
        self.values[ref] = value

    def skip_writes_unless(self, flag: jax.Array) -> None:
        """From here on, writes to skippable state (optimizer and scheduler state) keep
        their old value where ``flag`` is False (a grad scaler's overflow skip)."""
        self._condition = flag if self._condition is None else jnp.logical_and(
            self._condition, flag)

    def record(self, key: Any, default: Any = None) -> Any:
        """This step's bookkeeping entry ``key`` (set to ``default`` when missing and a
        default is given; None when missing without one)."""
        if default is not None:
            return self._records.setdefault(key, default)
        return self._records.get(key)

    def set_record(self, key: Any, value: Any) -> None:
        self._records[key] = value

    def records(self) -> list[tuple[Any, Any]]:
        """Every bookkeeping entry of this step, as ``(key, value)`` pairs."""
        return list(self._records.items())

    # ---- gradients ---------------------------------------------------------------
    def mark_loss(self, loss: Any) -> None:
        loss = jnp.asarray(loss)
        if loss.shape != () or not jnp.issubdtype(loss.dtype, jnp.floating):
            raise StateError(
                f"backward() needs a scalar floating-point loss, got shape {loss.shape} "
                f"dtype {loss.dtype}. Reduce the loss (e.g. .mean()) before backward()."
            )
        if self.phase != "forward":
            raise StateError(
                "backward() was called after the gradients were consumed in this step. "
                "Mark every loss before optimizer.step()."
            )
        if self.deferred:
            raise StateError(
                "backward() was called after a gradient-consuming call "
                f"({self.deferred[-1][2].what}) in the same step; call backward() first."
            )
        self.loss = loss if self.loss is None else self.loss + loss.astype(self.loss.dtype)

    @property
    def has_grads(self) -> bool:
        """True once backward has run in this step: gradients can be read and set."""
        return self._grads is not None

    def differentiated(self, p: _state.Parameter) -> bool:
        """Whether ``p`` has a gradient slot in this step (it may hold None)."""
        return self._grads is not None and p in self._grads

    def grad(self, p: _state.Parameter) -> Any:
        """``p``'s gradient now: what the last :meth:`set_grad` (or torch code, through
        the original parameter's ``.grad``) left; None after ``zero_grad()``."""
        if self._grads is None:
            raise StateError(
                f"The gradient of {p.name!r} is not available: gradients exist after "
                "cstorch.backward(loss) (or scaler.scale(loss).backward()), inside the "
                "gradient-consuming calls that follow it."
            )
        if p not in self._grads:
            if not p.requires_grad:
                return None  # as in torch: a frozen parameter has no gradient
            raise StateError(
                f"{p.name!r} is not differentiated in this step: only parameters held by "
                "an optimizer (with requires_grad=True) get gradients."
            )
        original = self.torch_grads.get(p)
        if original is not None:  # torch code may have changed or replaced original.grad
            self._grads[p] = _torch_grad_value(original, self._grads[p], p)
        return self._grads[p]

    def user_grad(self, p: _state.Parameter) -> Any:
        """``p.grad`` as the step's code sees it: while torch code runs after
        ``loss.backward()``, the torch tensor that the original torch parameter's
        ``.grad`` holds (so ``torch.nn.utils.clip_grad_norm_`` over
        ``optimizer.param_groups`` computes on it, and writes into it are the
        gradient's); inside an optimizer's own ``step`` and in JAX-facing steps, the
        JAX value."""
        value = self.grad(p)
        original = self.torch_grads.get(p)
        if self._torch_code and not self._jax_code and original is not None:
            return original.grad
        return value

    @contextlib.contextmanager
    def jax_gradients(self) -> Iterator[None]:
        """``p.grad`` reads JAX values while the block runs (an optimizer's step)."""
        self._jax_code += 1
        try:
            yield
        finally:
            self._jax_code -= 1

    def grad_or_none(self, p: _state.Parameter) -> Any:
        """``p``'s gradient, or None where it has none (not differentiated, or zeroed)."""
        return self.grad(p) if self.differentiated(p) else None

    def set_grad(self, p: _state.Parameter, g: Any) -> None:
        """Sets ``p``'s gradient (None clears it); the one way a gradient is written."""
        self.grad(p)
        self._grads[p] = g
        original = self.torch_grads.get(p)
        if original is not None:
            _set_torch_grad(original, g)

    @property
    def after_backward(self) -> bool:
        """True while the forward pass runs and a loss has been marked."""
        return self.phase == "forward" and self.loss is not None

    def defer(self, fn: Callable, args: tuple, kwargs: dict, what: str) -> DeferredValue:
        result = DeferredValue(what)
        self.deferred.append((fn, self.route((args, kwargs)), result))
        return result

    # ---- values leaving the differentiated pass ---------------------------------------
    def route(self, tree: Any) -> _Routed:
        if self.live is not None:
            tree = self.live.resolve(tree)
        if self.phase != "forward":
            return _Routed(None, inline=tree)
        arrays, skeleton = partition(tree, jax_array)
        routed = _Routed(skeleton, len(self.aux))
        self.aux.extend(arrays)
        return routed

    def unroute(self, routed: _Routed) -> Any:
        if routed.skeleton is None:
            tree = routed.inline
        else:
            tree = combine(self.aux_out[routed.first:], routed.skeleton)
        return jax.tree.map(
            lambda x: x.value if isinstance(x, DeferredValue) else x,
            tree,
            is_leaf=lambda x: isinstance(x, DeferredValue),
        )

    def add_closure(self, fn: Callable, args: tuple, kwargs: dict, kind: str) -> None:
        self.closures.append(_closures.ClosureCall(fn, kind, self.route((args, kwargs))))

    def note_model(self, model: Any) -> None:
        if any(m is model for m in self.models_used):
            return
        if self.models_used:
            raise StateError(
                "Detected that more than one compiled model was used in a step function "
                f"(`{self.step.__name__}`). Compile one module that contains both models "
                "and call it once per step."
            )
        self.models_used.append(model)

    # ---- the program ---------------------------------------------------------------
    def run(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """Runs the step's code; returns its outputs (see the module docstring).

        The code runs in a greenlet. A JAX-facing step runs to its end inside the
        differentiated pass, and its gradient-consuming calls are replayed after it. A
        torch-native step (``loss.backward()`` on a torch tensor) is suspended at its
        backward: the forward pass ends there, the gradients are computed, the torch
        tensors made so far get their values outside the differentiated pass, the
        original torch parameters get their ``.grad``, and the code resumes, so torch
        code after the backward (clipping, ``p.grad.mul_``) computes on real gradients.
        """
        diff_refs = self._differentiated
        primals = [self.values[p] for p in diff_refs]
        self.worker = greenlet.greenlet(lambda *_: _Finished(fn(*args, **kwargs)))
        created: list = []  # weak references to torch tensors made in the forward pass

        def forward(primals):
            self.diff = dict(zip(diff_refs, primals))
            with _recording_torch_tensors(created) as made:
                self.made = made
                result = _grad_regions.serve(self, self.resume())
            self.made = []
            finished = isinstance(result, _Finished)
            out_routed = self.route(result.value) if finished else None
            # Views take their value from their base: only the others get one.
            tensors = [t for t in (ref() for ref in created)
                       if t is not None and not _is_view(t)]
            written = list(self.written)
            loss = self.loss if self.loss is not None else jnp.zeros((), jnp.float32)
            self.phase = "after_forward"
            self.diff = {}
            return loss, (self.aux, [self.values[r] for r in written],
                          [t.__jax_array__() for t in tensors]), (out_routed, written, tensors)

        with _live_torch_parameters(self):
            return self._run(forward, primals)

    def _run(self, forward: Callable, primals: list) -> Any:
        loss_out, vjp_fn, aux, static = _vjp_with_static_aux(forward, primals)
        self.aux_out, written_values, tensor_values = aux
        out_routed, written, tensors = static
        for ref, value in zip(written, written_values):
            self.values[ref] = value
        if tensors:
            from torch_bridge import assign

            for tensor, value in zip(tensors, tensor_values):
                assign(tensor, value)  # the value outside the differentiated pass
        self.phase = "replay"
        if self.loss is not None:
            (grads,) = vjp_fn(jnp.ones_like(loss_out))
            self._grads = dict(zip(self._differentiated, grads))
            _apply_parameter_hooks(self)
        for call, routed, result in self.deferred:
            cargs, ckwargs = self.unroute(routed)
            result.resolve(call(*cargs, **ckwargs))
        if out_routed is not None:
            return self.unroute(out_routed)
        with self._torch_parameter_grads():
            # the torch code after loss.backward()
            result = _grad_regions.serve(self, self.resume())
        return self.live.resolve(result.value) if self.live is not None else result.value

    def finish(self, refs: list[_state.StateRef], outputs: Any) -> StepRecord:
        """The frozen record of the step once :meth:`run` returned ``outputs``: the new
        value of each of ``refs``, the outputs, and the closure calls with their arrays."""
        closures = tuple(self.closures)
        arrays = tuple(_closures.split_arguments(list(closures), self.unroute))
        return StepRecord(tuple(self.values[r] for r in refs), outputs, closures, arrays,
                          tuple(self.models_used))

    def backward_now(self, loss: Any) -> None:
        """A torch-native backward: marks ``loss`` and suspends the step's code."""
        self.mark_loss(loss)
        if greenlet.getcurrent() is not self.worker:
            raise StateError(
                "loss.backward() was called outside the traced step's own code (in a "
                "thread or greenlet of its own). Call it in the step function.")
        self.suspend(SUSPENDED)

    # ---- differentiation regions (cerebrax._step._grad_regions) ---------------------------
    def open_region(self, region: _grad_regions.Region) -> None:
        """Records a region opened at ``region.tensor`` (``x.requires_grad_()``)."""
        self.regions.append(region)

    def region_snapshot(self) -> dict:
        """What :meth:`region_changes` compares with, taken as a region opens."""
        return {"values": dict(self.values), "diff": dict(self.diff), "routed": len(self.aux)}

    def region_changes(self, snapshot: dict) -> dict:
        """The state the code in a region wrote, and the values it routed out of the
        differentiated pass (they leave the region as auxiliary output)."""
        before_values, before_diff = snapshot["values"], snapshot["diff"]
        return {
            "values": {r: v for r, v in self.values.items() if before_values.get(r) is not v},
            "diff": {r: v for r, v in self.diff.items() if before_diff.get(r) is not v},
            "routed": self.aux[snapshot["routed"]:],
        }

    def restore_region_changes(self, changes: dict) -> None:
        """Puts :meth:`region_changes`, as seen outside the region, back in place."""
        self.values.update(changes["values"])
        self.diff.update(changes["diff"])
        routed = changes["routed"]
        if routed:
            self.aux[len(self.aux) - len(routed):] = routed

    def replace_loss(self, loss: jax.Array) -> None:
        """The marked loss as seen outside a region that closed at ``loss.backward()``."""
        self.loss = loss

    def resume(self, value: Any = None) -> Any:
        """Runs the step's code (in its greenlet) until it finishes or suspends; returns
        what it finished or suspended with."""
        return _switch(self.worker, value)

    def suspend(self, message: Any) -> Any:
        """Suspends the step's code (called in it) with ``message`` for the trace that
        runs it; returns the value the trace resumes it with."""
        return _switch(self.worker.parent, message)

    @contextlib.contextmanager
    def _torch_parameter_grads(self) -> Iterator[None]:
        """The original torch parameters hold their gradients while the block runs."""
        from torch_bridge import JaxTensor

        saved, made = [], {}
        for original, p in self._aliases:
            if self.differentiated(p):
                saved.append((original, original.grad))
                if p not in made:  # tied originals share one gradient tensor
                    value = self._grads[p]
                    made[p] = None if value is None else JaxTensor(
                        value, original.dtype, device=original.device)
                original.grad = made[p]
                self.torch_grads.setdefault(p, original)
        self._torch_code = True
        try:
            yield
        finally:
            for original, previous in saved:
                original.grad = previous  # no tensor of the trace leaks out of the step
            self.torch_grads = {}
            self._torch_code = False


def _switch(target: greenlet.greenlet, value: Any) -> Any:
    """``target.switch(value)``, each greenlet keeping its own torch function modes.

    torch keeps its stack of function modes per thread, and the step's code and the
    trace share a thread. Code that suspends inside a mode's handler (``requires_grad_``
    and ``torch.autograd.grad`` do, see :mod:`cerebrax._step._grad_regions`) does so with the
    modes above the handler popped; the trace must not run on without them, nor the
    step's code resume with the trace's."""
    if "torch" not in sys.modules:
        return target.switch(value)
    from torch.overrides import _get_current_function_mode_stack

    mine = _get_current_function_mode_stack()
    try:
        return target.switch(value)
    finally:
        _set_function_modes(mine)


def _set_function_modes(modes: list) -> None:
    import torch

    while torch._C._len_torch_function_stack():
        torch._C._pop_torch_function_stack()
    for mode in modes:
        torch._C._push_on_torch_function_stack(mode)


def _leaf_at(primal: jax.Array, value: jax.Array) -> jax.Array:
    """``value``, with the derivative of ``primal``: a leaf whose value was replaced."""
    return jax.lax.stop_gradient(value) + (primal - jax.lax.stop_gradient(primal))


@dataclasses.dataclass(frozen=True)
class _Finished:
    """What the step's greenlet returns when the step's code has run to its end."""

    value: Any


@contextlib.contextmanager
def _live_torch_parameters(ctx: TraceContext) -> Iterator[None]:
    """While the block runs, torch code that reads a torch parameter of a compiled torch
    module reads the parameter's value in this step: the differentiated value in the
    forward pass, so a penalty such as ``sum(p.pow(2).sum() for p in
    model.parameters())`` has its gradient, and the updated value after
    ``optimizer.step()``. A torch function mode gives every torch call that takes such a
    parameter (``p ** 2``, ``p.detach()``, ``p.data``, ``torch.stack(params)``) a
    stand-in tensor whose value is the state's (``torch_bridge.stand_in``); reading or
    setting ``.grad`` and the other attributes keeps the parameter itself. Without it,
    torch code would compute with the values the module was built with, as constants."""
    aliases = [(original, p) for original, p in ctx._aliases if p in ctx.values]
    if not aliases:
        yield
        return
    from ._torch_parameters import ParameterReads

    with ParameterReads(aliases) as mode:
        ctx.live = mode
        try:
            yield
        finally:
            ctx.live = None


def _apply_parameter_hooks(ctx: TraceContext) -> None:
    """The torch parameters' gradient hooks (``p.register_hook``) on the new gradients."""
    aliases = [(original, p) for original, p in ctx._aliases if p in ctx._grads]
    if aliases:
        from ._torch_parameters import apply_gradient_hooks

        apply_gradient_hooks(ctx._grads, aliases)


@contextlib.contextmanager
def _recording_torch_tensors(created: list) -> Iterator[None]:
    """Lists the torch tensors of the step made while the block runs (if torch is used)."""
    if "torch_bridge" not in sys.modules:
        yield []
        return
    from torch_bridge import honouring_functions, on_backward, recording

    with recording() as made, on_backward(backward), honouring_functions():
        try:
            yield made
        finally:
            created.extend(made)


def _is_view(tensor: Any) -> bool:
    from torch_bridge import is_view

    return is_view(tensor)


def _torch_grad_value(original: Any, current: Any, p: _state.Parameter) -> Any:
    """The gradient a torch parameter's ``.grad`` holds now (None where it was set to
    None, as torch's ``zero_grad()`` does)."""
    grad = original.grad
    if grad is None:
        return None
    dtype = current.dtype if current is not None else jnp.result_type(p.value)
    return torch_to_jax(grad).astype(dtype)


def _set_torch_grad(original: Any, value: Any) -> None:
    from torch_bridge import JaxTensor, assign

    grad = original.grad
    if value is None:
        original.grad = None
    elif isinstance(grad, JaxTensor):
        assign(grad, value)
    else:
        original.grad = JaxTensor(value, original.dtype)


def _vjp_with_static_aux(forward: Callable, primals: list):
    """``jax.vjp(..., has_aux=True)`` where part of the auxiliary output is Python data.

    ``forward(primals) -> (loss, aux, static)``; returns ``(loss, vjp_fn, aux, static)``.
    """
    static: list = []

    def wrapped(primals):
        loss, aux, python_data = forward(primals)
        static.append(python_data)
        return loss, aux

    loss, vjp_fn, aux = jax.vjp(wrapped, primals, has_aux=True)
    return loss, vjp_fn, aux, static[0]


def backward(loss: Any) -> None:
    """Marks ``loss`` for differentiation: cerebrax's ``loss.backward()``.

    Inside a traced step the gradients of the loss with respect to every parameter
    held by an optimizer are computed once the step's forward pass is done; calls
    that consume them (``optimizer.step()``, ``scaler.step``, clipping, scheduler
    steps) run after, in program order.
    """
    ctx = active_context()
    if ctx is None:
        raise StateError(
            "cstorch.backward(loss) must be called inside a step decorated with "
            "@cstorch.trace: gradients are computed as part of the compiled step."
        )
    if is_torch_tensor(loss):  # loss.backward() in torch code: the torch-native step
        ctx.backward_now(as_jax(loss))
    else:
        ctx.mark_loss(loss)


def context_with_grads(what: str) -> ActiveContext:
    """The active trace context, once its step's gradients exist; ``what`` (the call
    that needs them, e.g. ``"SGD.step()"``) is named in the error otherwise."""
    ctx = active_context()
    if ctx is None:
        raise StateError(
            f"{what} must be called inside a step decorated with @cstorch.trace, after "
            "cstorch.backward(loss): the update is part of the compiled step."
        )
    if not ctx.has_grads:
        raise StateError(
            f"{what} was called before the loss was marked. Call cstorch.backward(loss) "
            "(or scaler.scale(loss).backward()) first."
        )
    return ctx


def _listed(call: tuple) -> tuple:
    """``(args, kwargs)`` with one-shot iterators as lists (``model.parameters()`` is a
    generator): a deferred call runs later, and JAX's tree functions take no iterators."""
    args, kwargs = call
    listed = lambda x: list(x) if isinstance(x, collections.abc.Iterator) else x  # noqa: E731
    return tuple(map(listed, args)), {k: listed(v) for k, v in kwargs.items()}


def deferrable(what: str):
    """Decorates a gradient-consuming method so that, after ``backward``, it is deferred.

    Called inside a traced step after the loss was marked, the call is recorded and
    replayed once the gradients exist; it returns a :class:`DeferredValue`.
    """

    def decorator(method: Callable) -> Callable:
        @functools.wraps(method)
        def wrapper(self, *args: Any, **kwargs: Any):
            ctx = active_context()
            args, kwargs = as_jax(_listed((args, kwargs)))
            if ctx is not None and ctx.after_backward:
                return ctx.defer(functools.partial(method, self), args, kwargs, what)
            return method(self, *args, **kwargs)

        return wrapper

    return decorator


def with_jax_gradients(method: Callable) -> Callable:
    """Decorates an optimizer's ``step``: the ``p.grad`` it reads is the JAX value,
    also when torch code calls it after ``loss.backward()`` (see
    :meth:`TraceContext.user_grad`)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any):
        ctx = active_context()
        if ctx is None:
            return method(*args, **kwargs)
        with ctx.jax_gradients():
            return method(*args, **kwargs)

    return wrapper


def deferrable_function(what: str):
    """Like :func:`deferrable`, for plain functions such as ``clip_grad_norm_``."""

    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any):
            ctx = active_context()
            args, kwargs = as_jax(_listed((args, kwargs)))
            if ctx is not None and ctx.after_backward:
                return ctx.defer(fn, args, kwargs, what)
            return fn(*args, **kwargs)

        return wrapper

    return decorator
