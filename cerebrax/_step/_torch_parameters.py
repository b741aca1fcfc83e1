"""Torch parameters read inside a traced step: the torch function mode behind
``TraceContext``'s live parameters (see ``_trace_context._live_torch_parameters``), and
their gradient hooks applied to the step's gradients.

Only imported where torch is (a compiled torch module exists)."""

from __future__ import annotations

import weakref
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from torch_bridge import JaxTensor, stand_in, to_jax

from .._runtime import RUNTIME
from ..errors import UnsupportedOpError
from . import _grad_regions
from ._active_context import active_context

__all__ = ["ParameterReads", "apply_gradient_hooks"]

MSG_HOOK_IN_STEP = """\
{what} on a compiled model's parameter was called inside a traced step. The step is
traced once, so a hook registered in it would be registered once, where torch registers
it again at every step. Register parameter hooks before the step is first called; they
apply at every step:

    for p in model.parameters():
        p.register_hook(lambda grad: grad.clamp(-1, 1))
    @cstorch.trace
    def training_step(x, y): ..."""

MSG_REQUIRES_GRAD_IN_STEP = """\
requires_grad of a compiled model's parameter was changed inside a traced step. Which
parameters are trained is part of the compiled graph: set p.requires_grad (or
p.requires_grad_()) before the step is first called, and before the optimizer is made."""

MSG_AFTER_JAX_BACKWARD = """\
torch code {what} a compiled parameter after cstorch.backward(loss) on a JAX loss. In such
a step the calls that consume gradients (optimizer.step(), clipping) run after the whole
step's code, so the parameter would be {what} before the update, not after it as the
code says. Compute the loss with torch (loss.backward() on a torch tensor: the step's
code then runs in order), or move the code after the step's call."""

MSG_POST_ACCUMULATE_HOOK = """\
A compiled model's parameter {name!r} has a hook registered with
register_post_accumulate_grad_hook. cerebrax does not run these: the gradients exist
only inside the compiled step, after its backward pass. Do the hook's work in the step,
after loss.backward() (e.g. on p.grad), or with a gradient hook (p.register_hook),
which cerebrax applies to the gradient as torch does."""

MSG_DATA_SHAPE = """\
`p.data = tensor` inside a traced step gives a compiled parameter of shape {old} a
value of shape {new}. A compiled model's parameters keep their shapes (the step is one
static graph). Assign a tensor of the parameter's shape, or build the model with the
new shape before cstorch.compile."""

# Attribute access that concerns the parameter object itself, not its value: torch
# routes property getters and setters (``p.grad``, ``p.requires_grad``, ``p.shape``)
# through the mode as ``__get__``/``__set__``; of those only ``p.data`` reads the value,
# and ``p.data = t`` writes it. (The method-wrappers are made anew at every access:
# they compare equal, never identical.)
_OBJECT_ACCESS = ("__get__", "__set__", "__delete__")
_DATA = torch.Tensor.data.__get__
_SET_DATA = torch.Tensor.data.__set__
_REQUIRES_GRAD = (torch.Tensor.requires_grad_, torch.Tensor.requires_grad.__set__)
_HOOK_REGISTRATIONS = (torch.Tensor.register_hook,
                       torch.Tensor.register_post_accumulate_grad_hook)
# Python's augmented assignments on a tensor (``n += x``): torch routes them through the
# mode under these names; like ``add_``, they write into their first argument.
_AUGMENTED = frozenset(f"__i{op}__" for op in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor",
    "lshift", "rshift"))


def _writes_in_place(func: Any) -> bool:
    """Whether the torch call ``func`` writes into its first argument (``add_``, ``+=``)."""
    name = getattr(func, "__name__", "")
    return name in _AUGMENTED or (name.endswith("_") and not name.startswith("_"))


class _TorchWrites:
    """A compiled parameter as torch code in a step reads and writes it: its writes
    (``p.data.clamp_``, ``p.copy_`` under ``no_grad``) happen also in a step that loss
    scaling skips, where only the optimizer's update is skipped."""

    __slots__ = ("parameter",)

    def __init__(self, parameter: Any):
        self.parameter = parameter

    @property
    def value(self) -> Any:
        ctx = active_context()
        if ctx is not None and ctx.after_backward and ctx.deferred:
            raise UnsupportedOpError(MSG_AFTER_JAX_BACKWARD.format(what="reads"))
        return self.parameter.value

    @value.setter
    def value(self, new: Any) -> None:
        ctx = active_context()
        if ctx is None:
            self.parameter.value = new
            return
        if ctx.after_backward:
            raise UnsupportedOpError(MSG_AFTER_JAX_BACKWARD.format(what="writes"))
        ctx.write(self.parameter, new, skippable=False)


class ParameterReads(TorchFunctionMode):
    """Gives torch calls a stand-in for each of ``aliases``' torch parameters.

    Args:
      aliases: ``(torch parameter, cerebrax Parameter)`` pairs; the stand-in of a torch
        parameter reads and writes the cerebrax parameter's ``value``.
    """

    def __init__(self, aliases: list[tuple[Any, Any]]):
        super().__init__()
        # One stand-in per torch parameter, so that views of it alias one another; the
        # compiled Parameter (what optimizer.param_groups holds) maps to the same one.
        self._stand_ins: dict[int, tuple[Any, Any]] = {}
        self._views: dict[Any, Any] = {}
        for original, p in aliases:
            tensor = self._views.get(p)
            if tensor is None:
                tensor = self._views[p] = stand_in(_TorchWrites(p), original)
                self._stand_ins[id(p)] = (p, tensor)
            self._stand_ins[id(original)] = (original, tensor)
        # Plain torch tensors that torch calls made inside the step (``torch.tensor(0.)``),
        # by id, with a weak reference, and those given a step tensor: see _local_of.
        self._made: dict[int, weakref.ref] = {}
        self._locals: dict[int, tuple[Any, Any]] = {}

    def __enter__(self) -> ParameterReads:
        RUNTIME.torch_views = self._views
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        RUNTIME.torch_views = {}
        super().__exit__(*exc)

    def _stand_in_of(self, x: Any) -> Any:
        found = self._stand_ins.get(id(x)) or self._locals.get(id(x))
        if found is not None and found[0] is x:
            return found[1]
        return x

    def _local(self, x: Any) -> Any:
        found = self._locals.get(id(x))
        return found[1] if found is not None and found[0] is x else x

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if torch.compiler.is_exporting():
            return func(*args, **kwargs)
        if func == _SET_DATA:
            return self._set_data(*args)
        if func in _HOOK_REGISTRATIONS and self._stand_in_of(args[0]) is not args[0]:
            raise UnsupportedOpError(MSG_HOOK_IN_STEP.format(what=func.__name__))
        autograd = _autograd_call(func)
        if autograd is not None:
            if func == torch.Tensor.detach_ and self._stand_in_of(args[0]) is not args[0]:
                raise UnsupportedOpError(MSG_REQUIRES_GRAD_IN_STEP)
            if func in _REQUIRES_GRAD and self._stand_in_of(args[0]) is not args[0]:
                return _requires_grad_of_parameter(*args, **kwargs)
            return autograd(*args, **kwargs)
        if getattr(func, "__name__", None) in _OBJECT_ACCESS and func != _DATA:
            return func(*args, **kwargs)
        args, kwargs = pytree.tree_map(self._stand_in_of, (args, kwargs))
        if args and _writes_in_place(func):
            args = (self._local_of(args[0], args[1:], kwargs), *args[1:])
        result = func(*args, **kwargs)
        self._note_made(result, args, kwargs)
        return result

    def _note_made(self, result: Any, args: tuple, kwargs: dict) -> None:
        """Remembers ``result`` where it is a new plain torch tensor, not a view."""
        if type(result) is not torch.Tensor or result._base is not None:
            return
        if any(x is result for x in pytree.tree_leaves((args, kwargs))):
            return  # ``t.to("cpu")`` returns its own argument
        self._made[id(result)] = weakref.ref(result)

    def _local_of(self, target: Any, args: tuple, kwargs: dict) -> Any:
        """The tensor an in-place op writes into: ``target`` itself, or, for a plain torch
        tensor made in this step that a value of the step is written into
        (``n = torch.tensor(0.); n += p.norm() ** 2``), a step tensor holding its value
        that stands in for it from now on, in every torch call, as a parameter's does.
        (A tensor made before the step stays a constant and the write is refused.)"""
        ref = self._made.get(id(target))
        if ref is None or ref() is not target:
            return target
        if not any(isinstance(x, JaxTensor) for x in pytree.tree_leaves((args, kwargs))):
            return target  # torch's own write, on constants
        local = JaxTensor(to_jax(target), target.dtype)
        self._locals[id(target)] = (target, local)
        del self._made[id(target)]
        return local

    def resolve(self, tree: Any) -> Any:
        """``tree`` with each torch tensor made in the step that was given a step tensor
        replaced by it (what the step returns, or passes to a closure, is what its torch
        code computed)."""
        return pytree.tree_map(self._local, tree) if self._locals else tree

    def _set_data(self, tensor: Any, value: Any) -> None:
        """``p.data = value``: a parameter's new value, kept in the compiled state."""
        target = self._stand_in_of(tensor)
        if target is tensor:  # not a compiled parameter: torch's own assignment
            _SET_DATA(tensor, value)
            return
        if tuple(value.shape) != tuple(target.shape):
            raise UnsupportedOpError(MSG_DATA_SHAPE.format(
                old=tuple(target.shape), new=tuple(value.shape)))
        with torch.no_grad():
            target.copy_(value)


def apply_gradient_hooks(grads: dict, aliases: list[tuple[Any, Any]]) -> None:
    """Runs the gradient hooks of each torch parameter on its gradient, as torch runs
    them on a leaf's gradient before it is accumulated into ``.grad``: in registration
    order, each on the previous one's result, a hook that returns None keeping it.

    Args:
      grads: the step's gradients by compiled parameter (JAX values), updated in place.
      aliases: ``(torch parameter, compiled parameter)`` pairs.
    """
    from torch_bridge import JaxTensor, unwrap

    for original, p in aliases:
        if getattr(original, "_post_accumulate_grad_hooks", None):
            raise UnsupportedOpError(MSG_POST_ACCUMULATE_HOOK.format(name=p.name))
        hooks = original._backward_hooks
        if not hooks or grads.get(p) is None:
            continue
        grad = JaxTensor(grads[p], original.dtype)
        for hook in list(hooks.values()):
            result = hook(grad)
            if result is not None:
                grad = result
        grads[p] = jnp.asarray(unwrap(grad))


def _autograd_call(func: Any) -> Any:
    """cerebrax's version of a torch autograd entry point called in a step, or None."""
    if func == torch.Tensor.requires_grad_ or func == torch.Tensor.requires_grad.__set__:
        return _grad_regions.requires_grad_
    if func is torch.autograd.grad:
        return _grad_regions.grad
    if func is torch.autograd.backward:
        return _backward
    if func == torch.Tensor.detach_:
        return _detach_
    if func == torch.Tensor.retain_grad:
        return _retain_grad
    return None


def _retain_grad(tensor: Any) -> None:
    """``t.retain_grad()`` on a tensor of the step: refused (``t.grad`` would stay None)."""
    from torch_bridge import JaxTensor

    if not isinstance(tensor, JaxTensor):
        return torch.Tensor.retain_grad(tensor)
    raise UnsupportedOpError(
        "t.retain_grad() inside a traced step: cerebrax does not fill a non-leaf tensor's "
        ".grad. A hook registered right after t is made, t.register_hook(fn), gets t's "
        "gradient (and may change it); pass what it computes to a step closure to see it.")


def _detach_(tensor: Any) -> Any:
    """``t.detach_()`` on a tensor of the step: its value carries no gradient from here."""
    from torch_bridge import JaxTensor, assign, is_view, unwrap

    if not isinstance(tensor, JaxTensor):
        return torch.Tensor.detach_(tensor)
    if is_view(tensor):
        raise UnsupportedOpError(
            "x.detach_() on a view inside a traced step: torch refuses to detach views in "
            "place too. Use x = x.detach() instead.")
    assign(tensor, jax.lax.stop_gradient(unwrap(tensor)))
    return tensor


def _backward(tensors: Any, grad_tensors: Any = None, retain_graph: Any = None,
              create_graph: bool = False, grad_variables: Any = None,
              inputs: Any = None) -> None:
    """``torch.autograd.backward(loss)``: ``loss.backward()``."""
    tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
    if grad_tensors is not None or grad_variables is not None or len(tensors) != 1:
        raise UnsupportedOpError(
            "torch.autograd.backward in a traced step differentiates one scalar loss, "
            "without grad_tensors: call loss.backward() (sum several losses first).")
    tensors[0].backward(retain_graph=retain_graph, create_graph=create_graph, inputs=inputs)


def _requires_grad_of_parameter(p: Any, requires_grad: bool = True) -> Any:
    """``p.requires_grad_(flag)`` on a compiled parameter: refused where it changes."""
    if bool(requires_grad) != p.requires_grad:
        raise UnsupportedOpError(MSG_REQUIRES_GRAD_IN_STEP)
    return p
