"""torch_bridge's own torch operators, lowered like ATen ops.

``torch.ops.torch_bridge.stop_gradient`` marks ``x.detach()`` and ``torch.no_grad()``
blocks before an exported program is decomposed (see ``torch_bridge._export``):
decomposition would otherwise turn both into plain aliases, and ``jax.grad`` would
differentiate through them. It lowers to ``lax.stop_gradient`` (``ops/shape.py``).

Three more operators carry torch's autograd extensions through an export, each as one
graph node that decomposition keeps whole (see ``torch_bridge._functions`` and
``torch_bridge._hooks``, which run them, and ``torch_bridge._autograd``, which registers
their lowerings):

- ``autograd_function(call, inputs)``: a custom ``torch.autograd.Function`` applied to
  ``inputs`` (its forward gives the outputs, its own backward the gradients);
- ``tensor_hook(call, x)``: ``x`` with a gradient hook (``x.register_hook(fn)``);
- ``module_hook(call, inputs)``: the tensors a module with backward hooks receives or
  returns (``register_full_backward_hook``, ``register_full_backward_pre_hook``).

Their ``call`` indexes ``RUNTIME.bridge_calls``, the Python objects (the Function class, the hook)
that an operator's arguments cannot hold; each object's ``fake(inputs)`` gives the
operator's outputs on fake tensors while the module is exported.
"""

from __future__ import annotations

from typing import Any

import torch

from cerebrax._runtime import RUNTIME

__all__ = ["autograd_function", "call", "module_hook", "register_call",
           "stop_gradient", "tensor_hook"]


def register_call(entry: Any, key: Any = None) -> int:
    """Adds ``entry`` to the calls that exported graphs make (``RUNTIME.bridge_calls``)
    and returns its index; an entry registered before under the same hashable ``key`` is
    reused, so that equal calls (a Function applied the same way in every block of a
    model) give equal graph nodes."""
    calls, keys = RUNTIME.bridge_calls, RUNTIME.bridge_call_keys
    if key is not None and key in keys:
        return keys[key]
    calls.append(entry)
    if key is not None:
        keys[key] = len(calls) - 1
    return len(calls) - 1


def call(index: int) -> Any:
    """The entry registered at ``index``."""
    return RUNTIME.bridge_calls[index]


@torch.library.custom_op("torch_bridge::stop_gradient", mutates_args=())
def stop_gradient(x: torch.Tensor) -> torch.Tensor:
    """Identity whose output carries no gradient (marks `detach` and no-grad blocks)."""
    return x.clone()


@stop_gradient.register_fake
def _stop_gradient_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("torch_bridge::autograd_function", mutates_args=())
def autograd_function(call: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """A custom ``autograd.Function`` applied to ``inputs`` (lowered, never run)."""
    raise NotImplementedError("torch_bridge::autograd_function only lives in exported graphs.")


@autograd_function.register_fake
def _autograd_function_fake(call: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return RUNTIME.bridge_calls[call].fake(inputs)


@torch.library.custom_op("torch_bridge::tensor_hook", mutates_args=())
def tensor_hook(call: int, x: torch.Tensor) -> torch.Tensor:
    """``x`` with a gradient hook (lowered, never run)."""
    raise NotImplementedError("torch_bridge::tensor_hook only lives in exported graphs.")


@tensor_hook.register_fake
def _tensor_hook_fake(call: int, x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("torch_bridge::module_hook", mutates_args=())
def module_hook(call: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """A hooked module's inputs or outputs, unchanged (lowered, never run)."""
    raise NotImplementedError("torch_bridge::module_hook only lives in exported graphs.")


@module_hook.register_fake
def _module_hook_fake(call: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(x) for x in inputs]


def _differentiated_by_lowering(ctx: Any, grads: Any) -> Any:
    raise NotImplementedError(
        "torch_bridge's operators are differentiated by their JAX lowerings, not by torch.")


def _function_outputs(ctx: Any, inputs: tuple, output: list) -> None:
    # As torch marks a Function's outputs: those it marks, and integer ones, need no grad.
    marks = RUNTIME.bridge_calls[inputs[0]].differentiable
    ctx.mark_non_differentiable(*[o for o, d in zip(output, marks) if not d])


def _identity_outputs(ctx: Any, inputs: tuple, output: list) -> None:
    ctx.mark_non_differentiable(*[o for o in output if not o.is_floating_point()])


# While a module is exported, outputs of these operators require grad as torch's would
# (user code may register a hook on them, or test requires_grad); torch never runs the
# backward registered here.
torch.library.register_autograd("torch_bridge::autograd_function", _differentiated_by_lowering,
                                setup_context=_function_outputs)
torch.library.register_autograd("torch_bridge::module_hook", _differentiated_by_lowering,
                                setup_context=_identity_outputs)

# A gradient hook's node has no users when it is recorded (its input keeps them until
# torch_bridge._hooks links them through it): dead-code elimination must keep it.
torch.fx.node.has_side_effect(torch.ops.torch_bridge.tensor_hook.default)
