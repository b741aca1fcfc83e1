"""Where torch's autograd extensions are taken over: while a step is traced or a module
is exported, custom Functions and gradient hooks act on the step's gradients.

Left to torch, a custom ``torch.autograd.Function`` inside a compiled step would have
its forward differentiated and its backward ignored, and gradient hooks would never be
called: torch's autograd never runs there (JaxTensors require no gradient, an export
records the forward only). :func:`honouring_functions` takes over, for the block it
guards, in the calling thread:

- ``torch.autograd.Function.apply`` (caught at its last step, the C++ ``apply`` it
  hands over to, so that ``round_ste = RoundSTE.apply`` bound earlier is caught too)
  runs the Function as a ``jax.custom_vjp`` on JaxTensors, or leaves a
  ``torch_bridge::autograd_function`` node while exporting (``torch_bridge._functions``).
  A compiled parameter given to it is its current value in the step. Functions that
  torch defines itself (activation checkpointing's, say) keep torch's behaviour: their
  backward is their forward's derivative, which JAX computes;
- ``tensor.register_hook`` (caught by a torch function mode) and modules' full backward
  hooks and pre-hooks (``nn.Module`` builds ``torch_bridge._hooks.ModuleHooks`` in place
  of torch's ``BackwardHook``) run on the gradients (``torch_bridge._hooks``);
  deprecated non-full module hooks are refused.

Calls on plain torch tensors, and calls from other threads, keep torch's behaviour.
The bridge's export enters :func:`exporting_functions`; cerebrax's trace context enters
:func:`honouring_functions` around the step's forward pass.

The graph nodes an export leaves (``torch_bridge.ops._custom``) are lowered here too, by
the routes' ``run_node``, ``tensor_hook_node`` and ``module_hook_node``. A Function's
forward and backward, and the hooks, may apply Functions and register hooks in turn, and
may run outside the block (a backward pass, a graph run): the routes run them inside
:func:`honouring_functions`, which this module hands them (their ``honouring``
argument). The routes do not import this module; it imports them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.modules.module as torch_module
import torch.utils._pytree as pytree
import torch.utils.checkpoint
from torch.overrides import TorchFunctionMode

from cerebrax._runtime import RUNTIME

from . import _functions, _hooks
from ._tensor import JaxTensor, refuse_in_direct
from .ops import lowering

__all__ = ["exporting", "exporting_functions", "honouring_functions"]

# Up to torch 2.13, ``Function.apply`` ends in ``super().apply``, torch's C++ ``apply``:
# an ``apply`` set on the class between them is reached also from a bound
# ``RoundSTE.apply`` taken before (a bound method keeps the function it was bound to).
# From torch 2.14, ``Function.apply`` is the C++ ``apply`` itself: it is replaced on
# ``Function`` too, which every ``RoundSTE.apply(...)`` looked up at the call reaches.
# A ``round_ste = RoundSTE.apply`` bound before is torch's C++ ``apply`` bound to the
# class, which no patch reaches; it calls the class's ``forward``, which is patched
# instead (:func:`_catch_bound_applies`).
_LEVEL = torch.autograd.function._SingleLevelFunction
_C_APPLY = torch._C._FunctionBase.__dict__["apply"]
_FUNCTION = torch.autograd.Function
_FUNCTION_APPLY = _FUNCTION.__dict__["apply"]
_PATCHED = (_LEVEL, _FUNCTION) if _FUNCTION_APPLY is _C_APPLY else (_LEVEL,)
_REGISTER_HOOK = torch.Tensor.register_hook
_GET_BACKWARD_HOOKS = torch.nn.Module._get_backward_hooks
_BACKWARD_HOOK = torch_module.BackwardHook


class _State(threading.local):
    depth = 0  # nesting of honouring_functions in this thread
    exporting = 0  # nesting of exporting_functions in this thread
    # (the Function torch's C++ apply is about to run, whether grad mode was on at the call)
    applying: tuple | None = None
    routed: tuple | None = None  # (Function, outputs) routed in its forward, for its ctx


_STATE = _State()
_LOCK = threading.Lock()


def exporting() -> bool:
    """Whether torch_bridge exports a module in this thread now."""
    return _STATE.exporting > 0


@contextlib.contextmanager
def honouring_functions() -> Iterator[None]:
    """While the block runs, custom autograd Functions and gradient hooks applied to
    JaxTensors (or to fake tensors of an export) run on the gradients, as in torch
    (see the module docstring). Re-entrant."""
    _install()
    _STATE.depth += 1
    try:
        with _HookRegistrations():
            yield
    finally:
        _STATE.depth -= 1
        _uninstall()


@contextlib.contextmanager
def exporting_functions() -> Iterator[None]:
    """:func:`honouring_functions` for a module's export: Functions and hooks leave
    graph nodes (see ``torch_bridge.ops._custom``)."""
    _STATE.exporting += 1
    try:
        with honouring_functions():
            yield
    finally:
        _STATE.exporting -= 1


_REENTRANT_CHECKPOINT = torch.utils.checkpoint.CheckpointFunction


def _install() -> None:
    with _LOCK:
        RUNTIME.bridge_patch_users += 1
        if RUNTIME.bridge_patch_users == 1:
            for cls in _PATCHED:
                cls.apply = classmethod(_apply)
            if _FUNCTION in _PATCHED:
                _catch_bound_applies()
            torch.nn.Module._get_backward_hooks = _get_backward_hooks
            torch_module.BackwardHook = _module_hooks


def _uninstall() -> None:
    with _LOCK:
        RUNTIME.bridge_patch_users -= 1
        if RUNTIME.bridge_patch_users == 0:
            del _LEVEL.apply
            if _FUNCTION in _PATCHED:
                _FUNCTION.apply = _FUNCTION_APPLY
                _release_bound_applies()
            torch.nn.Module._get_backward_hooks = _GET_BACKWARD_HOOKS
            torch_module.BackwardHook = _BACKWARD_HOOK


def _apply(cls: type, *args: Any, **kwargs: Any) -> Any:
    """``Function.apply``'s last step while patched: routed by where it runs and on what."""
    routed = _route(cls, args, kwargs)
    if routed is _NOT_ROUTED:
        return _C_APPLY.__get__(None, cls)(*args, **kwargs)
    return routed


_NOT_ROUTED = object()


def _route(cls: type, args: tuple, kwargs: dict) -> Any:
    """What ``cls.apply(*args, **kwargs)`` gives in this thread now, or ``_NOT_ROUTED``
    where torch's own ``apply`` runs it."""
    if _STATE.depth and cls is _REENTRANT_CHECKPOINT:
        # torch.utils.checkpoint(..., use_reentrant=True): its backward recomputes the
        # forward, so its gradients are the function's own, and none at all where no
        # tensor input requires grad (torch warns then); run it as that.
        function, _, *inputs = args
        if any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs):
            return function(*inputs)
        with torch.no_grad():
            return function(*inputs)
    if _STATE.depth and not cls.__module__.startswith("torch."):
        refuse_in_direct(f"the custom autograd Function {cls.__qualname__}")
        tensors = [x for x in pytree.tree_leaves((args, kwargs))
                   if isinstance(x, torch.Tensor)]
        if tensors and exporting() and not any(isinstance(t, JaxTensor) for t in tensors):
            return _functions.apply_exporting(cls, args, kwargs)
        args, kwargs = pytree.tree_map(_live, (args, kwargs))
        if any(isinstance(x, JaxTensor) for x in pytree.tree_leaves((args, kwargs))):
            return _functions.apply_to_values(cls, args, kwargs, honouring_functions)
    return _NOT_ROUTED


# torch 2.14's C++ apply reads ``boxed_grads_call`` from the Function's class just before
# it calls ``forward`` (with the ctx it made, or without one where the class has a
# ``setup_context``); reading it marks that call for the patched forwards. (torch 2.11
# and 2.12 have no such attribute, and need no mark: their ``apply`` is Python's.)
_BOXED_GRADS_CALL = _LEVEL.__dict__.get("boxed_grads_call", False)
_BACKWARD_CTX = torch.autograd.function.BackwardCFunction  # the ctx torch's apply makes


class _ApplyMark:
    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None and _STATE.depth:
            _STATE.applying = (owner, torch.is_grad_enabled())
        return _BOXED_GRADS_CALL


def _user_functions() -> list[type]:
    found, stack = [], [_FUNCTION]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if not sub.__module__.startswith("torch."):
                found.append(sub)
    return found


def _catch_bound_applies() -> None:
    """Patches the forward of every custom Function defined so far, so that a call of
    its C++ ``apply`` bound before is routed as ``Function.apply`` is (torch 2.14)."""
    _LEVEL.boxed_grads_call = _ApplyMark()
    for cls in _user_functions():
        patches = {"forward": _routing_forward(cls, cls.forward)}
        if torch.autograd.function._is_setup_context_defined(cls.setup_context):
            patches["setup_context"] = _routing_setup_context(cls, cls.setup_context)
        for name, patch in patches.items():
            RUNTIME.bridge_patches.append((cls, name, cls.__dict__.get(name)))
            setattr(cls, name, staticmethod(patch))


def _release_bound_applies() -> None:
    _LEVEL.boxed_grads_call = _BOXED_GRADS_CALL
    while RUNTIME.bridge_patches:
        cls, name, own = RUNTIME.bridge_patches.pop()
        if own is None:
            delattr(cls, name)
        else:
            setattr(cls, name, own)
    _STATE.applying = _STATE.routed = None


def _routing_forward(cls: type, forward: Any) -> Any:
    own_context = torch.autograd.function._is_setup_context_defined(cls.setup_context)

    @functools.wraps(forward)
    def routing_forward(*args: Any, **kwargs: Any) -> Any:
        applying, _STATE.applying = _STATE.applying, None
        if applying is None or applying[0] is not cls or not (
                own_context or args and isinstance(args[0], _BACKWARD_CTX)):
            return forward(*args, **kwargs)  # not called by torch's apply
        # torch's apply turned grad mode off for forward: the step's values are routed in
        # the caller's mode. An export is left as it is: it would record the switch.
        with (contextlib.nullcontext() if exporting() else torch.set_grad_enabled(applying[1])):
            routed = _route(cls, args if own_context else args[1:], kwargs)
        if routed is _NOT_ROUTED:
            return forward(*args, **kwargs)
        if not exporting():
            # torch's apply gives the outputs a grad_fn where an input requires grad (a
            # compiled parameter): marked non-differentiable, they stay the step's values.
            # (An export's outputs keep theirs: they carry its requires_grad flags.)
            outputs = [x for x in pytree.tree_leaves(routed) if isinstance(x, torch.Tensor)]
            if own_context:
                _STATE.routed = (cls, outputs)
            else:
                args[0].mark_non_differentiable(*outputs)
        return routed

    return routing_forward


def _routing_setup_context(cls: type, setup_context: Any) -> Any:
    @functools.wraps(setup_context)
    def routing_setup_context(ctx: Any, inputs: Any, output: Any) -> Any:
        routed, _STATE.routed = _STATE.routed, None
        if routed is None or routed[0] is not cls:
            return setup_context(ctx, inputs, output)
        ctx.mark_non_differentiable(*routed[1])  # the routed call kept its own ctx
        return None

    return routing_setup_context


def _live(x: Any) -> Any:
    """A torch tensor that requires grad, as the torch function modes of a traced step
    give it to torch ops (a compiled parameter's current value; ``Function.apply`` does
    not pass through those modes itself)."""
    if isinstance(x, torch.Tensor) and not isinstance(x, JaxTensor) and x.requires_grad:
        return x.view_as(x)
    return x


def _get_backward_hooks(module: torch.nn.Module) -> tuple:
    hooks = _GET_BACKWARD_HOOKS(module)
    if _STATE.depth:
        return _hooks.non_full_hooks_refused(module, hooks)
    return hooks


def _module_hooks(module: torch.nn.Module, hooks: list, pre_hooks: list) -> Any:
    if not _STATE.depth:
        return _BACKWARD_HOOK(module, hooks, pre_hooks)
    if type(module).__module__.startswith("torch.export."):
        # torch.export's wrapper around the exported module, which global module hooks
        # (register_module_full_backward_hook) would otherwise see as one more module.
        return _hooks.NO_MODULE_HOOKS
    return _hooks.ModuleHooks(module, hooks, pre_hooks, exporting=exporting(),
                              honouring=honouring_functions)


class _HookRegistrations(TorchFunctionMode):
    """Catches ``tensor.register_hook`` on JaxTensors and, while exporting, on fake
    tensors; every other call goes on as torch makes it."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _REGISTER_HOOK and _STATE.depth:
            handle = _hooks.register(*args, **kwargs, exporting=exporting(),
                                     honouring=honouring_functions)
            if handle is not None:
                return handle
        return func(*args, **kwargs)


# ---- where an exported graph runs ------------------------------------------------------------
# The nodes an export leaves for Functions and hooks (``torch_bridge.ops._custom``) run
# them where the graph runs, inside honouring_functions as in a traced step.
@lowering(torch.ops.torch_bridge.autograd_function.default)
def _lower_function(index: int, inputs: list) -> list:
    return _functions.run_node(index, inputs, honouring_functions)


@lowering(torch.ops.torch_bridge.tensor_hook.default)
def _lower_tensor_hook(index: int, x: Any) -> Any:
    return _hooks.tensor_hook_node(index, x, honouring_functions)


@lowering(torch.ops.torch_bridge.module_hook.default)
def _lower_module_hook(index: int, inputs: list) -> list:
    return _hooks.module_hook_node(index, inputs, honouring_functions)
