"""A torch module's forward traced op by op on JaxTensors, without ``torch.export``.

``torch.export`` costs the first step of a process about 2 s on a CPU (importing
``torch._dynamo``, tracing the module, decomposing it by a second trace) before JAX
traces anything. A module's forward can instead run on JaxTensors that hold the JAX
values of its parameters, buffers and inputs: every ATen op it makes is lowered where it
is made (:func:`torch_bridge._tensor.dispatch`), through the same op registry that an
exported graph's nodes are lowered with. :func:`run` does that.

The two captures agree only where the exported graph holds nothing beyond the ops
themselves. :func:`run` refuses (:class:`~torch_bridge._tensor.DirectRefused`, and
the caller exports) wherever they could differ:

- random ops (dropout, ``torch.rand``): the exported graph gives each its own split of
  the call's key, by its place in the graph;
- recurrent layers (:data:`REFUSED_FUNCTIONS`), which an export keeps whole to run as
  one ``lax.scan``; attention, which an export keeps whole too, runs whole here as well,
  through the same lowering (``_attention``);
- custom ``autograd.Function``\\ s, gradient hooks (tensor and full module hooks) and
  calls ``forward`` makes for their effect (a metric update): the export leaves nodes
  for them that run where the graph runs;
- half-precision values (an exported graph sums a broadcast half-precision operand's
  gradient in float32), ``torch.autocast``, and state or inputs whose JAX dtype is not
  the torch dtype the module holds (a precision policy's bfloat16 copy);
- a forward that assigns a parameter or buffer a tensor that is not a value of the
  trace, or returns something that is not a tensor or a plain Python value;
- any error: the export then raises the error it raises today (a branch on a tensor's
  value names its source line).

Nothing of a refused trace is kept: JAX values it made are left unused, and the module
gets its own tensors back.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import jax
import torch
import torch.nn.modules.module as torch_module
import torch.utils._pytree as pytree
from torch.nn.utils import stateless
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from cerebrax._runtime import RUNTIME

from . import _lazy_dynamo, ops
from ._tensor import DirectRefused, JaxTensor, _to_jax, paused_recording
from .ops._dtypes import export_dtype, jax_dtype, to_jax

__all__ = ["REFUSED_FUNCTIONS", "enabled", "run", "state_slots", "training_mode"]

# Torch functions whose ATen ops an export keeps whole (torch_bridge._export.KEPT_WHOLE):
# below the torch function layer they decompose before a JaxTensor sees them.
REFUSED_FUNCTIONS = {
    torch.lstm: "torch.lstm (a recurrent layer)",
    torch.gru: "torch.gru (a recurrent layer)",
    torch.rnn_tanh: "torch.rnn_tanh (a recurrent layer)",
    torch.rnn_relu: "torch.rnn_relu (a recurrent layer)",
    torch.Tensor.register_hook: "a gradient hook (Tensor.register_hook)",
    torch.Tensor.register_post_accumulate_grad_hook:
        "a gradient hook (Tensor.register_post_accumulate_grad_hook)",
}

_PLAIN = (type(None), bool, int, float, str)  # output leaves other than tensors
ENV = "CEREBRAX_TORCH_CAPTURE"  # "export": every module call is exported


def enabled() -> bool:
    """Whether modules may be traced directly (``CEREBRAX_TORCH_CAPTURE`` is not
    ``export``)."""
    value = os.environ.get(ENV, "auto").strip().lower()
    if value not in ("auto", "export"):
        raise ValueError(f"{ENV}={value!r}: use 'auto' (trace a module's forward op by op "
                         "where that gives the exported graph's program) or 'export'.")
    return value == "auto"


@contextlib.contextmanager
def training_mode(module: torch.nn.Module, train: bool) -> Iterator[None]:
    """Puts every submodule in ``train`` mode, then restores each one's own mode."""
    before = [(m, m.training) for m in module.modules()]
    module.train(train)
    try:
        yield
    finally:
        for m, was in before:
            m.training = was


def state_slots(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``module``'s parameters and buffers under every name, one per attribute slot.

    A submodule registered under two names (Model Zoo's gpt2 holds its final norm as
    ``ln_f`` and as ``transformer_decoder.norm``) has one slot per tensor: swapping
    it twice would restore the swapped-in tensor, not the module's, afterwards."""
    named = [*module.named_parameters(remove_duplicate=False),
             *module.named_buffers(remove_duplicate=False)]
    slots: set[tuple[int, str]] = set()
    found = []
    for name, t in named:
        owner, _, attr = name.rpartition(".")
        slot = (id(module.get_submodule(owner)), attr)
        if slot not in slots:
            slots.add(slot)
            found.append((name, t))
    return found


class _Guard(TorchFunctionMode):
    """Refuses the torch functions of :data:`REFUSED_FUNCTIONS`, and any call made
    under ``torch.autocast``; runs attention whole (:func:`_attention`)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        refused = REFUSED_FUNCTIONS.get(func)
        if refused is not None:
            raise DirectRefused(refused)
        if _autocast():
            raise DirectRefused("torch.autocast")
        if func is _SDPA:
            return _attention(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


_SDPA = torch.nn.functional.scaled_dot_product_attention
_SDPA_OP = torch.ops.aten.scaled_dot_product_attention.default


def _attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None,
               enable_gqa: bool = False) -> JaxTensor:
    """``scaled_dot_product_attention`` as one op, through the lowering an exported
    graph's kept-whole node runs (torch would otherwise decompose it before a JaxTensor
    sees it): the same program, fused for the platform where it can be."""
    if not all(isinstance(t, JaxTensor) for t in (query, key, value)):
        raise DirectRefused("scaled_dot_product_attention on tensors made outside the trace")
    if dropout_p > 0:
        raise DirectRefused("the random op scaled_dot_product_attention (dropout_p > 0)")
    if query.dtype != torch.float32:
        raise DirectRefused(f"scaled_dot_product_attention on {query.dtype}")
    mask = _to_jax(attn_mask)
    out = ops.lookup(_SDPA_OP).fn(None, query._jax, key._jax, value._jax, mask, dropout_p,
                                  is_causal, scale=scale, enable_gqa=enable_gqa)
    shape = (*query.shape[:-1], value.shape[-1])
    if tuple(out.shape) != shape:
        raise DirectRefused(f"scaled_dot_product_attention gave shape {tuple(out.shape)}")
    result = JaxTensor(out.astype(jax_dtype(query.dtype)), query.dtype)
    if not torch.is_grad_enabled():
        result._value = jax.lax.stop_gradient(result._value)
    return result


class _Ops(TorchDispatchMode):
    """Refuses random ATen ops, on JaxTensors and on the plain tensors ``forward`` makes
    itself alike (``torch.empty(n).bernoulli_(p)`` draws a mask with torch's generator,
    which would be one constant of the program)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        entry = ops.lookup(func)
        if torch.Tag.nondeterministic_seeded in func.tags or (entry is not None
                                                              and entry.random):
            raise DirectRefused(f"the random op {func}")
        return func(*args, **(kwargs or {}))


# torch marks a dispatch mode's __torch_dispatch__ as Dynamo-disabled when the class is
# made; its first call would import torch._dynamo (see torch_bridge._lazy_dynamo).
_lazy_dynamo.defer_function(_Ops.__dict__["__torch_dispatch__"])


def _autocast() -> bool:
    return any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))


def static_refusal(module: torch.nn.Module, params: dict, buffers: dict,
                   aliases: dict[str, str]) -> str | None:
    """Why ``module`` cannot be traced directly on these values, known before its
    forward runs; None where it may be."""
    if _autocast():
        return "torch.autocast"
    if (torch_module._global_backward_hooks or torch_module._global_backward_pre_hooks):
        return "a global module backward hook"
    for m in module.modules():
        if m._backward_hooks or m._backward_pre_hooks:
            return f"a module backward hook on {type(m).__name__}"
    for name, t in state_slots(module):
        value = (params if isinstance(t, torch.nn.Parameter) else buffers).get(aliases[name])
        if value is None:
            return f"{name!r} has no value"
        if t.is_floating_point() and t.dtype != torch.float32:
            return f"{name!r} is {t.dtype}"
        if jax.numpy.dtype(value.dtype) != jax.numpy.dtype(jax_dtype(t.dtype)):
            return f"{name!r} holds {value.dtype} for torch's {t.dtype}"
    return None


def _input(x: Any, dtype: torch.dtype | None) -> Any:
    """An input leaf as the trace sees it: a JAX array as a JaxTensor of the torch dtype
    an export would give it (see ``Converted.program``), any other value as it is."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype") or isinstance(x, torch.Tensor):
        if isinstance(x, torch.Tensor):
            raise DirectRefused("a torch tensor input")
        return x
    value = to_jax(x)
    torch_dtype = dtype or export_dtype(value.dtype)
    if torch_dtype.is_floating_point and torch_dtype != torch.float32:
        raise DirectRefused(f"a {torch_dtype} input")
    return JaxTensor(value, torch_dtype)


def _stand_in(value: jax.Array, like: torch.Tensor) -> JaxTensor:
    tensor = JaxTensor(value, like.dtype)
    if like.requires_grad:
        with torch._C.DisableTorchFunction():
            tensor.requires_grad_(True)
    if isinstance(like, torch.nn.Parameter):
        tensor._is_param = True  # isinstance(tensor, nn.Parameter), as in torch
    return tensor


def run(module: torch.nn.Module, params: dict, buffers: dict, aliases: dict[str, str],
        leaves: list, spec: Any, dtypes: list, *, train: bool
        ) -> tuple[list, Any, dict[str, Any]]:
    """Runs ``module``'s forward on JaxTensors: ``(output leaves, output spec, new
    buffers)``, as ``Program.run`` and ``Converted.run`` give them.

    Args:
      module: the torch module.
      params, buffers: the values by stored name (``aliases`` maps every state-dict name
        to it).
      leaves, spec: the call's inputs as torch pytree leaves and structure.
      dtypes: per leaf, the torch dtype an integer JAX input stands for, or None.
      train: the mode the forward runs in.

    Raises:
      DirectRefused: where the trace would not give the exported graph's program
        (see the module docstring).
    """
    from ._autograd import honouring_functions

    reason = static_refusal(module, params, buffers, aliases)
    if reason is not None:
        raise DirectRefused(reason)
    _lazy_dynamo.defer()  # torch's dispatch-mode machinery, without torch._dynamo
    RUNTIME.bridge_direct.append(threading.get_ident())
    try:
        with paused_recording(), honouring_functions(), _Guard(), _Ops():
            return _run(module, params, buffers, aliases, leaves, spec, dtypes, train)
    except DirectRefused:
        raise
    except Exception as e:  # the export raises its own error, or runs where this cannot
        raise DirectRefused(f"{type(e).__name__}: {e}") from e
    finally:
        RUNTIME.bridge_direct.remove(threading.get_ident())


def _run(module, params, buffers, aliases, leaves, spec, dtypes, train):
    made: dict[str, JaxTensor] = {}
    stand_ins: dict[str, JaxTensor] = {}
    kinds: dict[str, str] = {}
    for name, t in state_slots(module):
        stored = aliases[name]
        if stored not in made:
            is_param = isinstance(t, torch.nn.Parameter)
            made[stored] = _stand_in((params if is_param else buffers)[stored], t)
            kinds[stored] = "param" if is_param else "buffer"
        stand_ins[name] = made[stored]
    inputs = [_input(x, d) for x, d in zip(leaves, dtypes)]
    args, kwargs = pytree.tree_unflatten(inputs, spec)
    with (training_mode(module, train), _attributes_kept(module),
          stateless._reparametrize_module(module, stand_ins)):
        out = module(*args, **kwargs)
        held = {name: _held(module, name) for name in stand_ins}
    new_buffers = dict(buffers)
    for name, tensor in held.items():
        stored = aliases[name]
        if not isinstance(tensor, JaxTensor):
            raise DirectRefused(f"forward assigned {name!r} a tensor made outside the trace")
        if kinds[stored] == "param":
            if tensor is not made[stored] or tensor._jax is not params[stored]:
                raise DirectRefused(f"forward wrote the parameter {name!r}")
        elif tensor is not made[stored] or tensor._jax is not buffers[stored]:
            new_buffers[stored] = tensor._jax.astype(buffers[stored].dtype)
    out_leaves, out_spec = pytree.tree_flatten(out)
    return [_output(x) for x in out_leaves], out_spec, new_buffers


@contextlib.contextmanager
def _attributes_kept(module: torch.nn.Module) -> Iterator[None]:
    """After the block, no submodule's attribute holds a JaxTensor it did not hold
    before: the attribute gets its value back (``nn.LSTM`` keeps its weights in a list,
    ``_flat_weights``, that its forward refreshes from the swapped-in stand-ins), or
    goes where it is new (a cache ``forward`` filled with values of this trace)."""
    before = [(m, dict(vars(m))) for m in module.modules()]
    try:
        yield
    finally:
        for m, saved in before:
            for name, value in list(vars(m).items()):
                if saved.get(name, _MISSING) is value or not _holds_jax(value):
                    continue
                if name in saved:
                    setattr(m, name, saved[name])
                else:
                    delattr(m, name)


_MISSING = object()


def _holds_jax(value: Any) -> bool:
    if isinstance(value, (list, tuple, dict)):
        return any(isinstance(x, JaxTensor) for x in pytree.tree_leaves(value))
    return isinstance(value, JaxTensor)


def _held(module: torch.nn.Module, name: str) -> Any:
    owner, _, attr = name.rpartition(".")
    return getattr(module.get_submodule(owner), attr, None)


def _output(x: Any) -> Any:
    if isinstance(x, JaxTensor):
        return x._jax
    if isinstance(x, torch.Tensor):
        return to_jax(x)  # a constant the forward made
    if isinstance(x, _PLAIN):
        return x
    raise DirectRefused(f"an output of type {type(x).__name__}")
