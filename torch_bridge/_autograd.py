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
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.checkpoint
import torch.nn.modules.module as torch_module
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from . import _functions, _hooks
from ._tensor import JaxTensor

__all__ = ["exporting", "exporting_functions", "honouring_functions"]

# Up to torch 2.13, ``Function.apply`` ends in ``super().apply``, torch's C++ ``apply``:
# an ``apply`` set on the class between them is reached also from a bound
# ``RoundSTE.apply`` taken before (a bound method keeps the function it was bound to).
# From torch 2.14, ``Function.apply`` is the C++ ``apply`` itself: it is replaced on
# ``Function`` too, which every ``RoundSTE.apply(...)`` looked up at the call reaches.
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


_STATE = _State()
_INSTALLED = [0]  # threads inside honouring_functions (the patches are process-wide)
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
        _INSTALLED[0] += 1
        if _INSTALLED[0] == 1:
            for cls in _PATCHED:
                cls.apply = classmethod(_apply)
            torch.nn.Module._get_backward_hooks = _get_backward_hooks
            torch_module.BackwardHook = _module_hooks


def _uninstall() -> None:
    with _LOCK:
        _INSTALLED[0] -= 1
        if _INSTALLED[0] == 0:
            del _LEVEL.apply
            if _FUNCTION in _PATCHED:
                _FUNCTION.apply = _FUNCTION_APPLY
            torch.nn.Module._get_backward_hooks = _GET_BACKWARD_HOOKS
            torch_module.BackwardHook = _BACKWARD_HOOK


def _apply(cls: type, *args: Any, **kwargs: Any) -> Any:
    """``Function.apply``'s last step while patched: routed by where it runs and on what."""
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
        tensors = [x for x in pytree.tree_leaves((args, kwargs))
                   if isinstance(x, torch.Tensor)]
        if tensors and exporting() and not any(isinstance(t, JaxTensor) for t in tensors):
            return _functions.apply_exporting(cls, args, kwargs)
        args, kwargs = pytree.tree_map(_live, (args, kwargs))
        if any(isinstance(x, JaxTensor) for x in pytree.tree_leaves((args, kwargs))):
            return _functions.apply_to_values(cls, args, kwargs)
    return _C_APPLY.__get__(None, cls)(*args, **kwargs)


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
    return _hooks.ModuleHooks(module, hooks, pre_hooks)


class _HookRegistrations(TorchFunctionMode):
    """Catches ``tensor.register_hook`` on JaxTensors and, while exporting, on fake
    tensors; every other call goes on as torch makes it."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _REGISTER_HOOK and _STATE.depth:
            handle = _hooks.register(*args, **kwargs, exporting=exporting())
            if handle is not None:
                return handle
        return func(*args, **kwargs)
