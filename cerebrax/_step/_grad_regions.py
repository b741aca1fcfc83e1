"""``torch.autograd.grad`` inside a traced step: nested differentiation regions.

A traced step differentiates its loss with respect to the optimizers' parameters with
one ``jax.vjp`` (:mod:`cerebrax._step._trace_context`). Torch code in the step can also ask
for gradients with respect to a tensor of its own, as a gradient penalty does::

    x = x.clone().requires_grad_(True)
    out = model(x)
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    loss = criterion(out, y) + gx.pow(2).sum()
    loss.backward()

JAX differentiates functions, not values computed earlier, so cerebrax makes the code
between ``x.requires_grad_(True)`` and the call that consumes ``x``'s gradient a
function of ``x``. The step's code runs in a greenlet: ``requires_grad_`` suspends it
and opens a *region*, a ``jax.vjp`` of a function that takes ``x``'s value and resumes
the step's code with ``x`` holding that input. ``torch.autograd.grad`` (or
``loss.backward()``, which also gives ``x.grad``) suspends the code again: the function
returns the outputs, the region's ``vjp`` gives the gradients, and the code resumes with
them. Everything the code computed inside the region (torch tensors, state writes,
values routed out of the step's differentiated pass) leaves it as auxiliary output and
takes its value outside the region, so the rest of the step computes on it as usual.
Parameters' values are read from the enclosing differentiated pass, so with
``create_graph=True`` the gradients are themselves differentiable with respect to the
parameters (a penalty on them trains the model, as in torch).

A region closes once: gradients with respect to ``x`` are asked for once per step
(asking again is refused, also with ``retain_graph=True``). ``retain_graph`` is
otherwise accepted: the step's own backward pass never needs the torch graph.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from .._tree import combine, jax_array, partition
from ..errors import UnsupportedOpError
from ._active_context import ActiveContext, active_context

__all__ = ["SUSPENDED", "Close", "Open", "Region", "grad", "region_of", "requires_grad_",
           "serve"]

#: What the step's code suspends with at ``loss.backward()`` (the trace computes the
#: gradients, then resumes it).
SUSPENDED = object()

MSG_NOT_A_REGION = """\
torch.autograd.grad inside a traced step differentiates with respect to tensors that the
step made differentiable with x.requires_grad_(True) (a copy of an input, or a tensor the
step computed); {what} is not one. For a gradient penalty on the inputs:

    x = x.clone().requires_grad_(True)
    out = model(x)
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)

Gradients with respect to the model's parameters come from loss.backward() (p.grad after
it); torch.autograd.grad with respect to parameters is not supported in a traced step."""

MSG_CLOSED = """\
torch.autograd.grad asks for the gradient with respect to a tensor whose gradient was
already computed in this step (by an earlier torch.autograd.grad or loss.backward()).
cerebrax computes a tensor's gradients once per step, also with retain_graph=True: ask
for all of them in one call, e.g.
    gx, gz = torch.autograd.grad(out, (x, z))"""


@dataclasses.dataclass(eq=False)
class Region:
    """One open region: the tensor made differentiable and its value outside."""

    tensor: Any
    outer: jax.Array
    closed: bool = False


@dataclasses.dataclass(eq=False)
class Open:
    """The step's code asks to open a region at ``tensor``."""

    tensor: Any


@dataclasses.dataclass(eq=False)
class Close:
    """The step's code asks for gradients: of ``outputs`` (with cotangents
    ``cotangents``) with respect to ``inputs``; ``results`` fills as regions close."""

    outputs: list
    cotangents: list
    inputs: list
    results: dict = dataclasses.field(default_factory=dict)


def _context() -> ActiveContext | None:
    ctx = active_context()
    return ctx if ctx is not None and getattr(ctx, "worker", None) is not None else None


def region_of(tensor: Any) -> Region | None:
    """The region opened at ``tensor`` in the active step, if any."""
    ctx = _context()
    if ctx is None:
        return None
    return next((r for r in ctx.regions if r.tensor is tensor), None)


def requires_grad_(tensor: Any, flag: bool = True) -> Any:
    """``tensor.requires_grad_(flag)`` on a tensor of the step: opens a region."""
    import torch

    from torch_bridge import JaxTensor, detached_to_leaf, is_view

    ctx = _context()
    if not flag or ctx is None or not isinstance(tensor, JaxTensor) or tensor.requires_grad:
        return torch.Tensor.requires_grad_(tensor, flag)
    if is_view(tensor) and detached_to_leaf(tensor):
        pass  # x.detach().requires_grad_(): a new leaf, as torch.autograd.functional makes
    elif is_view(tensor):
        raise UnsupportedOpError(
            "x.requires_grad_(True) inside a traced step on a view of another tensor: "
            "make the differentiable tensor a copy first, x = x.clone().requires_grad_()")
    torch.Tensor.requires_grad_(tensor, True)
    ctx.suspend(Open(tensor))
    return tensor


def grad(outputs: Any, inputs: Any, grad_outputs: Any = None, retain_graph: Any = None,
         create_graph: bool = False, only_inputs: bool = True, allow_unused: Any = None,
         is_grads_batched: bool = False, materialize_grads: bool = False) -> tuple:
    """``torch.autograd.grad`` inside a traced step (see the module docstring)."""
    from torch_bridge import JaxTensor

    ctx = _context()
    outputs = _as_tuple(outputs)
    inputs = _as_tuple(inputs)
    if is_grads_batched:
        raise UnsupportedOpError(
            "torch.autograd.grad(..., is_grads_batched=True) is not supported in a traced "
            "step: call it once per grad_outputs, or use jax.vmap in JAX code.")
    for t in inputs:
        region = region_of(t)
        if region is None:
            raise UnsupportedOpError(MSG_NOT_A_REGION.format(what=_describe(t)))
        if region.closed:
            raise UnsupportedOpError(MSG_CLOSED)
    cotangents = _cotangents(outputs, _as_tuple(grad_outputs) if grad_outputs is not None
                             else None)
    values = [_value_of(o) for o in outputs]
    results = ctx.suspend(Close(values, cotangents, list(inputs)))
    grads = []
    for t in inputs:
        g = results[id(t)]
        if not create_graph:
            g = jax.lax.stop_gradient(g)
        grads.append(JaxTensor(g.astype(jnp.asarray(_value_of(t)).dtype), t.dtype))
    return tuple(grads)


def serve(ctx: ActiveContext, message: Any) -> Any:
    """Serves the step's requests until it finishes or suspends at its backward:
    returns that message (:class:`Close` requests reach the region they close)."""
    while isinstance(message, Open):
        message = _open(ctx, message.tensor)
    return message


def _open(ctx: ActiveContext, tensor: Any) -> Any:
    from torch_bridge import assign, is_view, recording

    region = Region(tensor, _value_of(tensor))
    ctx.open_region(region)
    box: dict = {}

    def inner(value: jax.Array):
        assign(tensor, value)
        before = ctx.region_snapshot()
        with recording() as made:
            message = serve(ctx, ctx.resume(tensor))
        box["message"] = message
        tensors = [t for t in (r() for r in list(ctx.made) + made)
                   if t is not None and not is_view(t) and t is not tensor]
        box["tensors"] = tensors
        aux = {"state": ctx.region_changes(before), "tensors": [_value_of(t) for t in tensors],
               "results": dict(message.results) if isinstance(message, Close) else {},
               "finished": _finished_arrays(message)}
        return _region_outputs(ctx, message), aux

    out, vjp_fn, aux = jax.vjp(inner, region.outer, has_aux=True)
    region.closed = True
    assign(tensor, region.outer)
    message = box["message"]
    _restore(ctx, aux, box["tensors"], message, assign)
    if isinstance(message, Close):
        message.outputs = list(out)
        if any(t is tensor for t in message.inputs):
            (message.results[id(tensor)],) = vjp_fn(message.cotangents)
        if len(message.results) == len(message.inputs):
            return ctx.resume(message.results)  # after torch.autograd.grad
        return message
    if message is SUSPENDED:  # loss.backward(): the loss, and x.grad
        ctx.replace_loss(out[0])
        (g,) = vjp_fn([jnp.ones_like(out[0])])
        _set_grad(tensor, g)
    return message


def _region_outputs(ctx: ActiveContext, message: Any) -> list:
    if isinstance(message, Close):
        return list(message.outputs)
    if message is SUSPENDED:
        return [ctx.loss]
    return []


def _restore(ctx: ActiveContext, aux: dict, tensors: list, message: Any, assign: Any) -> None:
    """Everything the region computed that outlives it, at its value outside."""
    ctx.restore_region_changes(aux["state"])
    for t, value in zip(tensors, aux["tensors"]):
        assign(t, value)
    if isinstance(message, Close):
        message.results.update(aux["results"])
    elif aux["finished"]:
        _set_finished_arrays(message, aux["finished"])


def _finished_arrays(message: Any) -> list:
    value = getattr(message, "value", None)
    if value is None:
        return []
    return partition(value, jax_array)[0]


def _set_finished_arrays(message: Any, arrays: list) -> None:
    message.value = combine(arrays, partition(message.value, jax_array)[1])


def _set_grad(tensor: Any, g: jax.Array) -> None:
    from torch_bridge import JaxTensor

    tensor.grad = JaxTensor(g.astype(jnp.asarray(_value_of(tensor)).dtype), tensor.dtype)


def _cotangents(outputs: tuple, grad_outputs: tuple | None) -> list:
    from torch_bridge import JaxTensor

    out = []
    for i, o in enumerate(outputs):
        value = _value_of(o)
        given = None if grad_outputs is None else grad_outputs[i]
        if given is None:
            if value.shape != ():
                raise UnsupportedOpError(
                    f"torch.autograd.grad: output {i} has shape {tuple(value.shape)}; "
                    "torch creates the gradient implicitly only for scalar outputs. Pass "
                    "grad_outputs=torch.ones_like(output), or reduce it (output.sum()).")
            out.append(jnp.ones_like(value))
        else:
            out.append(jnp.asarray(_value_of(given),
                                   value.dtype))
    return out


def _value_of(tensor: Any) -> jax.Array:
    """A tensor's value: a JaxTensor's JAX array, a plain tensor's as a constant."""
    from torch_bridge import unwrap

    return jnp.asarray(unwrap(tensor))


def _as_tuple(x: Any) -> tuple:
    import torch

    if isinstance(x, torch.Tensor):
        return (x,)
    return tuple(x)


def _describe(tensor: Any) -> str:
    import torch

    if isinstance(tensor, torch.nn.Parameter):
        return "a parameter of the compiled model"
    return f"a {type(tensor).__name__} of shape {tuple(tensor.shape)}"
