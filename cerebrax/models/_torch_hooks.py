"""The original torch module reads and writes the compiled state (torch's state-dict hooks).

After ``cstorch.compile(module)`` the values that traced steps update live in the compiled
model, not in the module's own tensors. So that a ported script's checkpoint code keeps
working on the module it created, three hooks are registered on that module:

- a state-dict pre-hook notes ``keep_vars`` (``state_dict(keep_vars=True)`` wants the
  module's own ``Parameter`` objects, e.g. for ``torch.export``, and is left alone);
- a state-dict post-hook replaces every entry the compiled model holds with a torch
  tensor of the compiled value: a host copy, in the module's own dtype (a host sync point:
  it waits for the steps that produce the values; inside a DataExecutor, call it from a
  checkpoint closure);
- a load-state-dict pre-hook writes every entry whose shape matches into the compiled
  state (cast to its dtype) and turns the entry into a torch tensor, so that torch then
  copies it into the module's own tensor and does its usual checks (missing and
  unexpected keys, size mismatches) and error messages.

The hooks act only for the module they were registered on, while its compiled model and
that model's backend are alive: a deep copy or an unpickled copy of the module, or the
module after ``cerebrax.reset()``, behaves as plain torch. Compiling the module again
replaces its hooks. While a traced step is being built the read hook stands aside (the
compiled state has no values there, and torch's export may read the module).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .. import _step
from .._runtime import RUNTIME
from .._step import to_numpy, to_torch

__all__ = ["install"]



class _Link:
    """What the hooks of one module share: the module, its compiled model, keep_vars."""

    def __init__(self, module: torch.nn.Module, compiled: Any):
        self.module = weakref.ref(module)
        self.compiled = weakref.ref(compiled)
        self.keep_vars: list[bool] = []

    def target(self, module: torch.nn.Module) -> Any:
        """The compiled model to read or write, or None to behave as plain torch."""
        if module is not self.module():
            return None
        compiled = self.compiled()
        if compiled is None or compiled.backend.generation != _step.current_generation():
            return None
        return compiled


class _Hook:
    """Base of the hooks: a copy of a module (deepcopy, pickle) gets an inert hook."""

    _from_public_api = True  # torch: a state-dict post-hook returns None

    def __init__(self, link: _Link | None):
        self.link = link

    def __deepcopy__(self, memo: dict) -> _Hook:
        return type(self)(None)

    def __reduce__(self) -> tuple:
        return (type(self), (None,))

    def _target(self, module: torch.nn.Module) -> Any:
        return None if self.link is None else self.link.target(module)


class _NoteKeepVars(_Hook):
    def __call__(self, module: torch.nn.Module, prefix: str, keep_vars: bool) -> None:
        if self.link is not None:
            self.link.keep_vars.append(bool(keep_vars))


class _ReadCompiledState(_Hook):
    def __call__(self, module: torch.nn.Module, destination: dict, prefix: str,
                 local_metadata: dict) -> None:
        if self.link is None:
            return
        keep_vars = self.link.keep_vars.pop() if self.link.keep_vars else False
        compiled = self._target(module)
        if compiled is None or keep_vars or _step.active_context() is not None:
            return
        tensors: dict[int, torch.Tensor] = {}
        for name, value in compiled.state_dict().items():  # owned host copies
            key = prefix + name
            if key not in destination:
                continue
            old = destination[key]
            dtype = old.dtype if isinstance(old, torch.Tensor) else None
            tensor = tensors.get(id(value))
            if tensor is None:  # a tied weight is one tensor under each of its names
                tensor = tensors[id(value)] = to_torch(value, dtype, copy=False)
            destination[key] = tensor


class _WriteCompiledState(_Hook):
    def __call__(self, module: torch.nn.Module, state_dict: dict, prefix: str,
                 local_metadata: dict, strict: bool, missing_keys: list,
                 unexpected_keys: list, error_msgs: list) -> None:
        compiled = self._target(module)
        if compiled is None:
            return
        own = {**dict(module.named_parameters(remove_duplicate=False)),
               **dict(module.named_buffers(remove_duplicate=False))}
        for name, ref in compiled._slots().items():
            key = prefix + name
            if key not in state_dict:
                continue
            value = state_dict[key]
            array = to_numpy(value)  # reads a lazy checkpoint array once
            shape = tuple(ref.stored.shape)
            if shape == () and array.shape == (1,):  # torch's legacy 0-d parameters
                array = array.reshape(())
            if tuple(array.shape) == shape:
                compiled._write_slot(key, ref, array)
            mine = own.get(name)
            if mine is not None and mine.is_meta:
                # The compiled state took this tensor's storage over: torch's own copy
                # into it is a no-op, which torch does silently from a meta tensor (and
                # still checks the shape).
                state_dict[key] = torch.empty(array.shape, dtype=mine.dtype, device="meta")
            elif not isinstance(value, torch.Tensor):
                # torch copies only tensors into the module's own: give it one (a size
                # mismatch is then reported by torch itself).
                state_dict[key] = to_torch(array, copy=False)


def install(module: torch.nn.Module, compiled: Any) -> None:
    """Makes ``module.state_dict()`` / ``module.load_state_dict()`` use ``compiled``."""
    for handle in RUNTIME.torch_hook_handles.pop(module, []):
        handle.remove()
    link = _Link(module, compiled)
    RUNTIME.torch_hook_handles[module] = [
        module.register_state_dict_pre_hook(_NoteKeepVars(link)),
        module.register_state_dict_post_hook(_ReadCompiledState(link)),
        module.register_load_state_dict_pre_hook(_WriteCompiledState(link)),
    ]
