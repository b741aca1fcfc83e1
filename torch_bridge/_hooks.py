"""Gradient hooks on activations and modules' backward hooks, run on the gradients.

torch calls a tensor's hooks (``h.register_hook(fn)``) with the tensor's gradient (the
sum over all its uses, earlier and later than the registration), in registration order,
each on the result of the one before; a hook that returns a tensor replaces the
gradient. A module's full backward pre-hooks (``register_full_backward_pre_hook``) get
the gradients of its outputs and may replace them; its full backward hooks
(``register_full_backward_hook``) get the gradients of its inputs and of its outputs and
may replace the former. torch_bridge runs each of them in the backward pass of a
``jax.custom_vjp`` identity, on JaxTensors:

- A tensor hook in a module's forward that torch_bridge exports leaves a
  ``torch_bridge::tensor_hook(call, h)`` node without users (:func:`register`). Once the
  graph is decomposed, :func:`link_tensor_hooks` moves it right after ``h``'s node and
  routes every use of ``h`` through it (several hooks on one tensor form a chain, the
  first registered nearest the uses, so the first runs first): the hook sees the
  gradient of every use, as in torch. A hook in forward on a parameter, buffer or input
  of the module is refused: torch registers it again at every call.
- A tensor hook in torch code of a traced step (on a JaxTensor) makes the tensor's value
  the identity's output, which later uses read. Uses before the registration would
  bypass it, so a tensor that an op has already used, or a view, is refused.
- ``handle.remove()`` before the backward pass: the hook is not called.
- Module hooks: while torch_bridge honours hooks, ``nn.Module`` builds a
  :class:`ModuleHooks` where it would build torch's ``BackwardHook``. It passes the
  tensors the module receives and those it returns through identities (one
  ``torch_bridge::module_hook`` node each while exporting); the outputs' backward runs
  the pre-hooks and keeps the outputs' gradients, the inputs' backward runs the hooks.
  Where no input of the module is differentiated, the hooks run at the outputs with
  ``None`` input gradients, as torch does (with torch's warning). Deprecated non-full
  hooks (``register_backward_hook``) are refused.

``torch_bridge._autograd`` routes ``tensor.register_hook`` and ``nn.Module``'s
``BackwardHook`` here (see ``honouring_functions``) and registers :func:`tensor_hook_node`
and :func:`module_hook_node` as the lowerings of the nodes. It hands each of them its
``honouring_functions`` (the ``honouring`` argument), inside which the hooks run, so
that Functions and hooks applied in a hook are honoured too; this module does not import
``torch_bridge._autograd``, which imports it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch
from jax.custom_derivatives import SymbolicZero

from cerebrax.errors import TensorReadError, UnsupportedOpError

from ._program import module_path
from ._tensor import JaxTensor, assign, is_view, mark_used, paused_recording
from .ops._custom import call, register_call
from .ops._dtypes import export_dtype, to_jax

__all__ = ["NO_MODULE_HOOKS", "ModuleHooks", "TensorHook", "link_tensor_hooks",
           "module_hook_node", "non_full_hooks_refused", "register", "tensor_hook_node"]

# ``torch_bridge._autograd.honouring_functions``, as its callers hand it in: the context
# the hooks run in.
Honouring = Callable[[], contextlib.AbstractContextManager[None]]

MSG_HOOK_AFTER_USE = """\
A gradient hook was registered (tensor.register_hook) on a tensor that torch code of
the traced step had already used. torch would apply the hook to the gradient of every
use, the earlier ones included, which cerebrax cannot reproduce once they have run.
Register the hook right after the tensor is made, before its first use:

    out = compiled_model(x)
    out.register_hook(fn)      # before out is used
    loss = loss_fn(out, y)"""

MSG_HOOK_ON_VIEW = """\
A gradient hook was registered (tensor.register_hook) on a view of another tensor
(a slice, x[0], x.view(...), or a compiled parameter itself) in torch code of the
traced step, which cerebrax does not support. Register it on the tensor the view was
made from, or on view.clone(); a parameter's hook, once before the first step."""

MSG_HOOK_ON_STATE = """\
A gradient hook was registered (tensor.register_hook) in the forward of module {module}
on {what},
which torch registers again at every call (the hooks pile up, step after step), while
the compiled graph holds it once. Register a parameter's hook once, before the first
step, outside forward; or register it on an activation computed from the input."""

MSG_NON_FULL_HOOK = """\
A module has a backward hook registered with register_backward_hook (or
register_module_backward_hook), which torch has deprecated and cerebrax does not run.
Use register_full_backward_hook (module.register_full_backward_hook(hook)), which
cerebrax applies to the gradients as torch does."""

MSG_HOOK_READS = """\
A gradient hook ({hook}) reads a tensor's value into Python ({detail}). A compiled
step runs it once, while its graph is built, when no value is known yet. Compute with
tensors instead (torch.where(cond, a, b) for a branch on values), or read the value in
a step closure."""

MSG_HOOK_SHAPE = """\
A gradient hook ({hook}) returned a gradient of shape {got} for a tensor of shape
{want}; torch raises here too. Return a tensor of the gradient's shape, or None."""

_READ_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                jax.errors.TracerIntegerConversionError)


# ---- tensor hooks ----------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class TensorHook:
    """One ``tensor.register_hook(hook)``; also the handle it returns."""

    hook: Callable[[Any], Any]
    removed: bool = False

    def remove(self) -> None:
        """Removes the hook: from then on it is not called."""
        self.removed = True

    def __enter__(self) -> TensorHook:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def register(tensor: torch.Tensor, hook: Callable, *, exporting: bool,
             honouring: Honouring) -> TensorHook | None:
    """``tensor.register_hook(hook)`` on a JaxTensor or, while a module is exported, a
    fake tensor (see the module docstring); None where torch's own registration applies
    (a plain tensor). On a JaxTensor the hook runs inside ``honouring()``."""
    if isinstance(tensor, JaxTensor):
        if is_view(tensor) or tensor._source is not None:
            raise UnsupportedOpError(MSG_HOOK_ON_VIEW)
        if tensor._used:
            raise UnsupportedOpError(MSG_HOOK_AFTER_USE)
        entry = TensorHook(hook)
        assign(tensor, _hooked(entry, tensor._jax, tensor.dtype, honouring))
        return entry
    if not exporting:
        return None
    if not tensor.requires_grad:  # torch's own check and message
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    entry = TensorHook(hook)
    torch.ops.torch_bridge.tensor_hook(register_call(entry), tensor)
    return entry


def tensor_hook_node(index: int, x: jax.Array, honouring: Honouring) -> jax.Array:
    """The output of a ``tensor_hook(index, x)`` node where its graph runs (its lowering,
    which ``torch_bridge._autograd`` registers): ``x`` through the hook registered at
    ``index``, which runs inside ``honouring()``."""
    return _hooked(call(index), x, export_dtype(x.dtype), honouring)


def _hooked(entry: TensorHook, value: jax.Array, dtype: torch.dtype,
            honouring: Honouring) -> jax.Array:
    """``value``, whose cotangent passes through ``entry``'s hook (run inside
    ``honouring()``)."""

    @jax.custom_vjp
    def identity(x: jax.Array) -> jax.Array:
        return x

    def identity_fwd(x: Any) -> tuple[jax.Array, None]:
        return x.value, None

    def identity_bwd(_: None, g: Any) -> tuple:
        if isinstance(g, SymbolicZero):
            return (None,)
        if entry.removed:
            return (g,)
        with _calling(entry.hook, honouring):
            out = entry.hook(JaxTensor(g, dtype))
        return (g if out is None else _cotangent(entry.hook, out, g),)

    identity.defvjp(identity_fwd, identity_bwd, symbolic_zeros=True)
    return identity(value)


def link_tensor_hooks(program: torch.export.ExportedProgram) -> None:
    """Routes every use of a hooked tensor through its ``tensor_hook`` nodes (see the
    module docstring)."""
    graph = program.graph_module.graph
    op = torch.ops.torch_bridge.tensor_hook.default
    hooked: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is op:
            if call(node.args[0]).removed:
                graph.erase_node(node)
            else:
                hooked.setdefault(node.args[1], []).append(node)
    for source, marks in hooked.items():
        _chain(source, marks, program)
    if hooked:
        graph.lint()
        program.graph_module.recompile()


def _chain(source: torch.fx.Node, marks: list[torch.fx.Node],
           program: torch.export.ExportedProgram) -> None:
    """``source -> marks[-1] -> ... -> marks[0] -> every other use of source``."""
    if source.op == "placeholder":
        raise UnsupportedOpError(MSG_HOOK_ON_STATE.format(
            module=module_path(marks[0]), what=_placeholder_kind(source, program)))
    previous = source
    for mark in reversed(marks):
        mark.args = (mark.args[0], previous)
        previous.append(mark)
        mark.meta["nn_module_stack"] = source.meta.get("nn_module_stack", {})
        previous = mark
    source.replace_all_uses_with(marks[0], delete_user_cb=lambda user: user not in marks)


def _placeholder_kind(node: torch.fx.Node, program: torch.export.ExportedProgram) -> str:
    for spec in program.graph_signature.input_specs:
        if spec.arg.name == node.name:
            kind = spec.kind.name.lower().replace("_", " ")
            return f"a {kind} ({spec.target or node.name!r})"
    return f"an input ({node.name!r})"


# ---- module hooks ----------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class _ModuleState:
    """One call of a module with backward hooks: what its two identities share."""

    module: torch.nn.Module
    hooks: list
    pre_hooks: list
    n_inputs: int = -1
    input_index: list[int] | None = None
    n_outputs: int = -1
    output_index: list[int] | None = None
    inputs_differentiated: bool = False
    grad_outputs: tuple | None = None

    def outputs_backward(self, grads: list) -> list:
        """The outputs' gradients after the pre-hooks (kept for the hooks)."""
        grad_outputs = _packed(self.output_index, grads, self.n_outputs)
        for hook in self.pre_hooks:
            result = hook(self.module, grad_outputs)
            if result is None:
                continue
            if len(result) != len(grad_outputs):
                raise RuntimeError("Backward pre hook returned an invalid number of "
                                   f"grad_output, got {len(result)}, but expected "
                                   f"{len(grad_outputs)}")
            grad_outputs = result
        self.grad_outputs = grad_outputs
        if self.input_index is None or not self.inputs_differentiated:
            self._hooks_without_inputs()
        return [grad_outputs[i] for i in self.output_index]

    def _hooks_without_inputs(self) -> None:
        """torch's case of a module none of whose inputs needs a gradient."""
        warnings.warn("Full backward hook is firing when gradients are computed with "
                      "respect to module outputs since no inputs require gradients. See "
                      "https://docs.pytorch.org/docs/main/generated/torch.nn.Module.html"
                      "#torch.nn.Module.register_full_backward_hook for more details.",
                      stacklevel=2)
        grad_inputs = (None,) * self.n_inputs
        for hook in self.hooks:
            result = hook(self.module, grad_inputs, self.grad_outputs)
            if result is not None and not (isinstance(result, tuple)
                                           and all(r is None for r in result)):
                raise RuntimeError("Backward hook for Modules where no input requires "
                                   "gradient should always return None or None for all "
                                   "gradients.")
        self.grad_outputs = None

    def inputs_backward(self, grads: list) -> list:
        """The inputs' gradients after the hooks."""
        if self.grad_outputs is None:
            return grads
        grad_inputs = _packed(self.input_index, grads, self.n_inputs)
        for hook in self.hooks:
            result = hook(self.module, grad_inputs, self.grad_outputs)
            if result is None:
                continue
            if len(result) != len(grad_inputs):
                raise RuntimeError("Backward hook returned an invalid number of "
                                   f"grad_input, got {len(result)}, but expected "
                                   f"{len(grad_inputs)}")
            grad_inputs = result
        self.grad_outputs = None
        return [grad_inputs[i] for i in self.input_index]


def _packed(index: list[int], values: list, size: int) -> tuple:
    out = [None] * size
    for i, v in zip(index, values):
        out[i] = v
    return tuple(out)


@dataclasses.dataclass(eq=False)
class _ModuleHookCall:
    """A ``module_hook`` node: which call, which side, and the tensors' torch dtypes."""

    state: _ModuleState
    side: str  # "inputs" or "outputs"
    dtypes: tuple


class ModuleHooks:
    """What ``nn.Module`` builds in place of ``torch.utils.hooks.BackwardHook`` while
    torch_bridge honours hooks (see the module docstring); on plain torch tensors it
    hands over to torch's own ``BackwardHook``.

    Args:
      module: the module being called.
      user_hooks: its full backward hooks (and the global ones).
      user_pre_hooks: its full backward pre-hooks (and the global ones).
      exporting: whether torch_bridge exports a module in this thread now.
      honouring: the context the hooks run in (``honouring_functions``).
    """

    torch_backward_hook: type = torch.utils.hooks.BackwardHook

    def __init__(self, module: torch.nn.Module, user_hooks: list, user_pre_hooks: list, *,
                 exporting: bool, honouring: Honouring):
        self.state = _ModuleState(module, list(user_hooks), list(user_pre_hooks))
        self._exporting = exporting
        self._honouring = honouring
        self._torch: Any = None

    def _torch_hook(self) -> Any:
        if self._torch is None:
            self._torch = self.torch_backward_hook(self.state.module, self.state.hooks,
                                                   self.state.pre_hooks)
        return self._torch

    def setup_input_hook(self, args: tuple) -> tuple:
        """The module's positional inputs, passed through the inputs' identity."""
        index = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        kind = _kind([args[i] for i in index], self._exporting)
        if kind is None:
            return self._torch_hook().setup_input_hook(args)
        self.state.n_inputs = len(args)
        if not index or not torch.is_grad_enabled():
            return args
        self.state.input_index = index
        wrapped = self._wrap("inputs", [args[i] for i in index], kind)
        out = list(args)
        for i, t in zip(index, wrapped):
            out[i] = t
        return tuple(out) if type(args) is tuple else type(args)(*out)

    def setup_output_hook(self, result: Any) -> Any:
        """The module's outputs (a tensor or a tuple), passed through the outputs'
        identity."""
        items = result if isinstance(result, tuple) else (result,)
        index = [i for i, a in enumerate(items) if isinstance(a, torch.Tensor)]
        kind = _kind([items[i] for i in index], self._exporting)
        if kind is None:
            return self._torch_hook().setup_output_hook(result)
        self.state.n_outputs = len(items)
        if not index or not torch.is_grad_enabled():
            return result
        self.state.output_index = index
        wrapped = self._wrap("outputs", [items[i] for i in index], kind)
        out = list(items)
        for i, t in zip(index, wrapped):
            out[i] = t
        return tuple(out) if isinstance(result, tuple) else out[0]

    def _wrap(self, side: str, tensors: list, kind: str) -> list:
        entry = _ModuleHookCall(self.state, side, tuple(t.dtype for t in tensors))
        if kind == "export":
            return list(torch.ops.torch_bridge.module_hook(register_call(entry), tensors))
        mark_used(tensors)
        values = _module_identity(entry, [t._jax for t in tensors], list(entry.dtypes),
                                  self._honouring)
        return [JaxTensor(v, t.dtype) for v, t in zip(values, tensors)]


class _NoModuleHooks:
    """Module hooks that leave a module's inputs and outputs as they are."""

    def setup_input_hook(self, args: tuple) -> tuple:
        """The inputs, unchanged."""
        return args

    def setup_output_hook(self, result: Any) -> Any:
        """The outputs, unchanged."""
        return result


NO_MODULE_HOOKS = _NoModuleHooks()


def _kind(tensors: Sequence[torch.Tensor], exporting: bool) -> str | None:
    """``"values"`` (JaxTensors), ``"export"`` (while exporting) or None (torch's)."""
    if any(isinstance(t, JaxTensor) for t in tensors):
        return "values"
    if tensors and exporting:
        return "export"
    return None


def module_hook_node(index: int, inputs: list, honouring: Honouring) -> list:
    """The outputs of a ``module_hook(index, inputs)`` node where its graph runs (its
    lowering, which ``torch_bridge._autograd`` registers): ``inputs`` through the
    identity registered at ``index``, whose hooks run inside ``honouring()``."""
    entry = call(index)
    dtypes = [export_dtype(x.dtype) if d.is_floating_point else d
              for x, d in zip(inputs, entry.dtypes)]
    return _module_identity(entry, list(inputs), dtypes, honouring)


def _module_identity(entry: _ModuleHookCall, arrays: list, dtypes: list,
                     honouring: Honouring) -> list:
    """``arrays`` through the identity of one side of a hooked module's call (its hooks
    run inside ``honouring()``)."""
    state, inputs = entry.state, entry.side == "inputs"
    if inputs:
        state.inputs_differentiated = False
    avals = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in arrays]

    @jax.custom_vjp
    def identity(*xs: Any) -> list:
        return list(xs)

    def identity_fwd(*primals: Any) -> tuple[list, None]:
        if inputs:
            state.inputs_differentiated = any(p.perturbed for p in primals)
        return [p.value for p in primals], None

    def identity_bwd(_: None, cotangents: list) -> tuple:
        grads = [None if isinstance(c, SymbolicZero) else JaxTensor(c, d)
                 for c, d in zip(cotangents, dtypes)]
        with _calling(state.module, honouring):
            grads = (state.inputs_backward if inputs else state.outputs_backward)(grads)
        return tuple(None if g is None else _cotangent(state.module, g, a)
                     for g, a in zip(grads, avals))

    identity.defvjp(identity_fwd, identity_bwd, symbolic_zeros=True)
    return identity(*arrays)


# ---- shared ----------------------------------------------------------------------------------
def _cotangent(what: Any, grad: Any, like: Any) -> jax.Array:
    """A gradient a hook returned, as the cotangent of a value shaped like ``like``."""
    value = jnp.asarray(to_jax(grad) if isinstance(grad, torch.Tensor) else grad)
    if tuple(value.shape) != tuple(jnp.shape(like)):
        raise UnsupportedOpError(MSG_HOOK_SHAPE.format(
            hook=_name(what), got=tuple(value.shape), want=tuple(jnp.shape(like))))
    return value.astype(like.dtype)


def _name(what: Any) -> str:
    if isinstance(what, torch.nn.Module):
        return f"a backward hook of {type(what).__name__}"
    return getattr(what, "__qualname__", repr(what))


@contextlib.contextmanager
def _calling(what: Any, honouring: Honouring) -> Iterator[None]:
    """Runs hook code on JaxTensors of the backward pass (see ``_functions._part``)."""
    try:
        with paused_recording(), honouring():
            yield
    except _READ_ERRORS as e:
        detail = str(e).strip().splitlines()[0]
        raise TensorReadError(MSG_HOOK_READS.format(hook=_name(what), detail=detail)) from e


def non_full_hooks_refused(module: torch.nn.Module, hooks: tuple) -> tuple:
    """``Module._get_backward_hooks``' result, refused where it holds non-full hooks."""
    full, non_full = hooks
    if non_full:
        raise UnsupportedOpError(MSG_NON_FULL_HOOK)
    return full, non_full
