"""``JaxTensor``: a torch tensor whose value is a JAX array, for torch code on JAX values.

Inside a cerebrax traced step, torch code runs on the step's values: a loss module on
the model's outputs, ``outputs.argmax(-1).int()``, ``torch.nn.utils.clip_grad_norm_``
on the gradients. Those values are :class:`JaxTensor` objects: torch tensors (a wrapper
subclass with torch's shape and dtype and no storage) that hold a JAX array, usually a
tracer of the step's program. Every ATen op torch runs on them reaches
:func:`JaxTensor.__torch_dispatch__` and is lowered through the same op registry as
``torch_bridge.convert`` (:mod:`torch_bridge.ops`), so the torch code lands in the same
single ``jax.jit`` program:

- torch's own meta kernels give each result's shape and dtype (torch's semantics:
  ``argmax`` is ``int64``), the lowering gives its value; 64-bit torch dtypes hold
  32-bit JAX values unless ``jax_enable_x64`` is on;
- an op without a lowering runs its torch decomposition (into ops that have one);
- in-place ops (``mul_``, ``clamp_``, ``copy_``) compute the functional op and rebind
  the tensor's value;
- torch tensors that are not JaxTensors (a loss module's weight, ``torch.tensor(0.5)``)
  enter the program as constants;
- reading a value (``.item()``, ``float(t)``, ``if t > 0``) asks JAX for a concrete
  value, which inside a traced step raises JAX's concretization error (cerebrax turns
  it into ``TensorReadError``).

:func:`recording` lists the JaxTensors created while it is active, so that a traced
step can give tensors made before the backward pass their values after it;
:func:`on_backward` installs what ``tensor.backward()`` does.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch._decomp
import torch.utils._pytree as pytree

from cerebrax._runtime import RUNTIME
from cerebrax.errors import UnsupportedOpError

from . import _lazy_dynamo, ops
from .ops._dtypes import export_dtype, jax_dtype, to_jax
from .ops._scalar_ops import zero_dim_as_half

# Tensors of this module caught in reference cycles (a traced step's graph, a closure's
# arguments) are freed before the interpreter shuts down, while torch can still release
# their Python objects: collected during finalization instead, torch's C++ side aborts
# the process now and then ("terminate called without an active exception", exit 134).
atexit.register(gc.collect)

__all__ = ["DirectRefused", "JaxTensor", "assign", "detached_to_leaf", "is_view",
           "on_backward", "recording", "refuse_in_direct", "stand_in", "unwrap", "wrap"]

aten = torch.ops.aten

MSG_NO_BACKWARD = """\
tensor.backward() on a value of a compiled step works inside a @cstorch.trace step:
the gradients are computed as part of the compiled program. Call it there, e.g.

    @cstorch.trace
    def training_step(inputs, targets):
        loss = loss_fn(compiled_model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss"""

MSG_NO_LOWERING = """\
torch code inside a traced step ran {op}, which torch_bridge cannot lower to JAX: it
has no lowering and no torch decomposition.
Register a lowering (it receives the op's arguments with every tensor as a JAX array):

    import torch
    from torch_bridge import lowering

    @lowering(torch.ops.{name})
    def my_lowering(*args, **kwargs):
        ...  # JAX code; return a jax.Array, or a tuple if the op returns several"""

MSG_DETACHED_WRITE = """\
An in-place op writes into x.detach() (or a view of it) inside a compiled step. In
torch that changes x's values but not the gradient computed through x, which cerebrax
does not reproduce. Write into a copy, x.detach().clone(), or compute a new tensor."""

MSG_REINTERPRETING_WRITE = """\
An in-place op writes into a view that reinterprets its tensor's bytes (a dtype view
such as x.view(torch.int32), or view_as_real) inside a compiled step. cerebrax does not
write through such views: compute a new tensor instead of writing in place."""

class DirectRefused(Exception):
    """A direct trace (``torch_bridge._direct``) met a construct it does not run as the
    exported graph would; the caller exports the module instead."""


def in_direct() -> bool:
    """Whether this thread runs a direct trace (``torch_bridge._direct``) now."""
    return bool(RUNTIME.bridge_direct) and threading.get_ident() in RUNTIME.bridge_direct


def refuse_in_direct(what: str) -> None:
    """Raises :class:`DirectRefused` (naming ``what``) while this thread runs a direct
    trace."""
    if in_direct():
        raise DirectRefused(what)


_HALF = (torch.float16, torch.bfloat16)

# Ops that return a Python number: they read the value.
_READS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default}
# Ops that only relabel a value (their lowering would copy it or stop its gradient).
_ALIASES = {aten.alias.default, aten.lift_fresh.default, aten.detach.default}



class JaxTensor(torch.Tensor):
    """A torch tensor holding a JAX array (see the module docstring).

    Args:
      value: the JAX array (or tracer).
      dtype: the torch dtype the tensor reports; by default the one torch code expects
        for ``value``'s dtype (integers as ``torch.int64``, as an exported input). A
        64-bit torch dtype may hold a 32-bit JAX value.
      device: the torch device the tensor reports (the CPU; ``"meta"`` for the
        gradient of a parameter whose storage the compiled state took over).
    """

    _value: jax.Array
    # A view (``x[:, 0]``, ``x.select(1, 1)``, ``x.detach()``): the tensor it views and the
    # function from that tensor's value to this one's. Its value is read from the base
    # and a write to it writes the base, as torch's views alias their base's storage.
    _view: tuple[JaxTensor, Callable[[jax.Array], jax.Array]] | None = None
    # A tensor that stands for a value kept elsewhere (see stand_in): its value is
    # ``_source.value``, read at every use, and a write sets it.
    _source: Any = None
    # Set once an op has taken the tensor (or a view of it) as an argument: a gradient
    # hook registered later would miss those uses' gradients (torch_bridge._hooks).
    _used: bool = False

    @staticmethod
    def __new__(cls, value: jax.Array, dtype: torch.dtype | None = None,
                device: Any = "cpu") -> JaxTensor:
        dtype = export_dtype(value.dtype) if dtype is None else dtype
        return torch.Tensor._make_wrapper_subclass(
            cls, tuple(int(d) for d in value.shape), dtype=dtype, device=device,
            requires_grad=False)

    def __init__(self, value: jax.Array, dtype: torch.dtype | None = None,
                 device: Any = "cpu"):
        super().__init__()
        self._jax = value
        for recorder in RUNTIME.bridge_recorders:
            recorder.append(weakref.ref(self))

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def _jax(self) -> jax.Array:
        """The value; a view's is computed from its base's current value."""
        if self._source is not None:
            return self._source.value
        if self._view is None:
            return self._value
        base, fn = self._view
        return fn(base._jax)

    @_jax.setter
    def _jax(self, value: jax.Array) -> None:
        if self._source is not None:
            self._source.value = value
            return
        if self._view is None:
            self._value = value
            return
        base, fn = self._view
        if fn is _detached and _root(base)._source is None:
            raise UnsupportedOpError(MSG_DETACHED_WRITE)
        if self.dtype != base.dtype:  # view(torch.int32) of a float tensor, say
            raise UnsupportedOpError(MSG_REINTERPRETING_WRITE)
        base._jax = _write_through(fn, base, value)

    def __jax_array__(self) -> jax.Array:
        return self._jax

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        kind = "traced" if isinstance(self._jax, jax.core.Tracer) else "value"
        return f"JaxTensor({kind}, shape={tuple(self.shape)}, dtype={self.dtype})"

    def __reduce_ex__(self, protocol: int) -> Any:
        raise TypeError("A JaxTensor lives inside a compiled step and cannot be pickled; "
                        "pass it to a step closure to get a plain torch tensor.")

    def numpy(self, *, force: bool = False) -> Any:
        """The value as a numpy array; outside a compiled step only (inside, the value
        is a tracer: read it in a step closure)."""
        import numpy as np

        return np.asarray(self._jax)  # reads the value (an error on a tracer)

    def backward(self, gradient: Any = None, retain_graph: Any = None,
                 create_graph: bool = False, inputs: Any = None) -> None:
        """Marks this scalar loss for differentiation with respect to the optimizers'
        parameters, inside a compiled step; ``gradient``, ``create_graph`` and
        ``inputs`` are refused (``retain_graph`` is accepted and has no effect)."""
        if gradient is not None or create_graph or inputs is not None:
            raise UnsupportedOpError(
                "tensor.backward() in a compiled step takes no gradient, create_graph or "
                "inputs: it differentiates a scalar loss with respect to the optimizers' "
                "parameters.")
        if not RUNTIME.bridge_backward:
            raise UnsupportedOpError(MSG_NO_BACKWARD)
        RUNTIME.bridge_backward[-1](self)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        return dispatch(func, args, kwargs or {})


def is_view(tensor: Any) -> bool:
    """Whether ``tensor`` is a JaxTensor that views another (its value is the other's)."""
    return isinstance(tensor, JaxTensor) and tensor._view is not None


def wrap(value: Any, dtype: torch.dtype | None = None) -> JaxTensor:
    """A :class:`JaxTensor` holding ``value`` (a JAX array or tracer)."""
    return JaxTensor(jnp.asarray(value), dtype)


def unwrap(tree: Any) -> Any:
    """``tree`` with every JaxTensor replaced by its JAX array."""
    return pytree.tree_map(lambda x: x._jax if isinstance(x, JaxTensor) else x, tree)


@contextlib.contextmanager
def recording() -> Iterator[list]:
    """Lists (weak references to) the JaxTensors created while the block runs."""
    created: list = []
    RUNTIME.bridge_recorders.append(created)
    try:
        yield created
    finally:
        RUNTIME.bridge_recorders.remove(created)


@contextlib.contextmanager
def paused_recording() -> Iterator[None]:
    """No :func:`recording` lists the JaxTensors created while the block runs (values of
    an inner JAX trace, such as a custom ``autograd.Function``'s forward)."""
    saved = RUNTIME.bridge_recorders[:]
    RUNTIME.bridge_recorders.clear()
    try:
        yield
    finally:
        RUNTIME.bridge_recorders[:] = saved


def mark_used(tree: Any) -> None:
    """Marks the JaxTensors of ``tree`` (and the tensors they view) as used by an op."""
    for leaf in pytree.tree_leaves(tree):
        while isinstance(leaf, JaxTensor):
            leaf._used = True
            leaf = leaf._view[0] if leaf._view is not None else None


@contextlib.contextmanager
def on_backward(handler: Callable[[JaxTensor], None]) -> Iterator[None]:
    """``tensor.backward()`` calls ``handler(tensor)`` while the block runs."""
    RUNTIME.bridge_backward.append(handler)
    try:
        yield
    finally:
        RUNTIME.bridge_backward.remove(handler)


# ---- dispatch ------------------------------------------------------------------------------

def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """Runs ATen op ``func`` on JaxTensor arguments (see the module docstring).

    Under ``torch.no_grad()`` (or ``set_grad_enabled(False)``, ``inference_mode()``)
    its results carry no gradient, as torch records no graph for them."""
    _lazy_dynamo.defer()  # torch's meta kernels, without importing torch._dynamo
    out = _run_op(func, args, kwargs)
    if not torch.is_grad_enabled():
        _without_gradient(out, args)
    return out


def _without_gradient(out: Any, args: tuple) -> None:
    """Stops the gradient of the new JaxTensors among ``out`` (an in-place op's result is
    its argument, written already; a view's value is computed from its base)."""
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if not isinstance(t, JaxTensor) or any(t is a for a in args) or t._source is not None:
            continue
        if t._view is None:
            t._value = jax.lax.stop_gradient(t._value)
        elif t._view[1] is not _detached:
            base, fn = t._view
            t._view = (base, lambda v, fn=fn: jax.lax.stop_gradient(fn(v)))


def _run_op(func: Any, args: tuple, kwargs: dict) -> Any:
    mark_used((args, kwargs))
    if func in _READS:
        return _read(func, args, kwargs)
    if func in _ALIASES:
        if func is aten.lift_fresh.default:
            return JaxTensor(args[0]._jax, args[0].dtype)
        fn = _detached if func is aten.detach.default else (lambda v: v)
        return _viewing(JaxTensor(args[0]._jax, args[0].dtype), args[0], fn)
    if func is aten.copy_.default:
        return _copy_(*args, **kwargs)
    if func._schema.is_mutable and func._schema.name.endswith("_"):
        return _in_place(func, args, kwargs)
    if func in _BATCH_NORMS:
        updated = _batch_norm_updating(func, args, kwargs)
        if updated is not None:
            return updated
    entry = ops.lookup(func)
    if entry is None or entry.random:
        return _decompose(func, args, kwargs)
    meta_args, meta_kwargs = _to_meta((args, kwargs))
    meta = func(*meta_args, **meta_kwargs)  # torch's shapes and dtypes of the results
    if in_direct() and any(isinstance(m, torch.Tensor) and m.dtype in _HALF
                           for m in pytree.tree_leaves(meta)):
        # An exported graph broadcasts half-precision operands with a float32-summed
        # gradient (torch_bridge._program._broadcast_half); op by op they are not.
        raise DirectRefused(f"{func} with a half-precision result")
    jax_args, jax_kwargs = _to_jax((args, kwargs))
    if torch.Tag.pointwise in func.tags:
        jax_args = zero_dim_as_half(jax_args)
    out = _wrap_like(entry.fn(*jax_args, **jax_kwargs), meta, func)
    if func.is_view and isinstance(args[0], JaxTensor):
        return _views(out, func, args, kwargs, entry.fn, jax_args, jax_kwargs)
    return out


def _views(out: Any, func: Any, args: tuple, kwargs: dict, fn: Callable, jax_args: tuple,
           jax_kwargs: dict) -> Any:
    """A view op's results as views of ``args[0]`` (one, or each of a list)."""
    base, rest = args[0], jax_args[1:]
    if isinstance(out, JaxTensor):
        return _viewing(out, base, lambda v: fn(v, *rest, **jax_kwargs))
    return type(out)(
        _viewing(o, base, lambda v, i=i: fn(v, *rest, **jax_kwargs)[i])
        for i, o in enumerate(out))


def _viewing(view: JaxTensor, base: JaxTensor, fn: Callable) -> JaxTensor:
    view._view = (base, fn)
    return view


def _detached(value: jax.Array) -> jax.Array:
    """``x.detach()``'s view function: the value, without a gradient."""
    return jax.lax.stop_gradient(value)


def _root(tensor: JaxTensor) -> JaxTensor:
    """The tensor that ``tensor`` views, through views of views (itself if no view)."""
    while tensor._view is not None:
        tensor = tensor._view[0]
    return tensor


def stand_in(source: Any, like: torch.Tensor) -> JaxTensor:
    """A tensor shaped and typed like ``like`` (its dtype, ``requires_grad``) whose
    value is ``source.value``, read at every use; a write into it (or into a view of
    it) sets ``source.value``. Swapped into a torch parameter while a step is traced,
    it makes torch code that reads the parameter read the step's current value."""
    tensor = torch.Tensor._make_wrapper_subclass(
        JaxTensor, tuple(int(d) for d in like.shape), dtype=like.dtype, device="cpu",
        requires_grad=like.requires_grad)
    tensor._source = source
    return tensor


def detached_to_leaf(tensor: JaxTensor) -> bool:
    """Makes ``tensor``, an ``x.detach()``, a tensor of its own (its own value, no longer
    written through by ``x``); False, and nothing changed, where it is no such view."""
    if tensor._view is None or tensor._view[1] is not _detached:
        return False
    tensor._value, tensor._view = tensor._jax, None
    return True


def assign(tensor: JaxTensor, value: jax.Array) -> None:
    """Makes ``value`` (same shape and dtype) ``tensor``'s value in place: the tensor
    object stays, and a view writes through to its base, as torch's ``copy_`` would."""
    tensor._jax = value


def _write_through(fn: Callable, base: JaxTensor, value: jax.Array) -> jax.Array:
    """``base``'s new value after the view ``fn(base)`` is overwritten with ``value``.

    Which base element each view element reads comes from the view function applied
    to the elements' positions, a constant computed while the step is traced."""
    current = base._jax
    with jax.ensure_compile_time_eval():  # a constant, not a part of the program
        positions = fn(jnp.arange(current.size, dtype=jnp.int32).reshape(current.shape))
    if (isinstance(positions, jax.core.Tracer) or jnp.shape(positions) != jnp.shape(value)
            or not jnp.issubdtype(positions.dtype, jnp.integer)):
        raise UnsupportedOpError(MSG_REINTERPRETING_WRITE)
    positions = np.asarray(positions).reshape(-1)
    if np.unique(positions).size != positions.size:
        raise UnsupportedOpError(
            "An in-place op writes into a view in which several elements are one element "
            "of its tensor (an expand()); torch refuses it too. Write to a clone() of the "
            "view instead.")
    value = jnp.asarray(value).astype(current.dtype).reshape(-1)
    return current.reshape(-1).at[positions].set(value).reshape(current.shape)


def _read(func: Any, args: tuple, kwargs: dict) -> Any:
    """``.item()``, ``bool(t)``, ``torch.equal``: the concrete value (JAX raises on a tracer)."""
    values = _to_jax(args)
    if func is aten.equal.default:
        a, b = values
        return bool(a.shape == b.shape and jnp.all(a == b))
    value = values[0]
    if func is aten.is_nonzero.default:
        return bool(value)
    return value.item()


def _copy_(self: JaxTensor, src: Any, non_blocking: bool = False) -> JaxTensor:
    value = jnp.asarray(_to_jax(src))
    self._jax = jnp.broadcast_to(value, tuple(self.shape)).astype(jax_dtype(self.dtype))
    return self


def _in_place(func: Any, args: tuple, kwargs: dict) -> Any:
    """``x.op_(...)``: the functional ``op``, then ``x`` holds its result."""
    packet = getattr(aten, func._schema.name.split("::")[-1][:-1], None)
    overload = getattr(packet, func._overloadname, None) if packet is not None else None
    if overload is None:
        return _decompose(func, args, kwargs)
    result = overload(*args, **kwargs)
    target = args[0]
    if not isinstance(target, JaxTensor):
        raise UnsupportedOpError(
            f"{func} writes into a torch tensor that is not part of the compiled step "
            f"({type(target).__name__} of shape {tuple(target.shape)}). Compute a new "
            "tensor instead of writing in place.")
    value = result._jax if isinstance(result, JaxTensor) else jnp.asarray(result)
    target._jax = jnp.broadcast_to(value, tuple(target.shape)).astype(jax_dtype(target.dtype))
    return target


# Batch norm in train mode writes its running statistics into its arguments, though
# torch's schemas of these two ops do not mark them as written.
_BATCH_NORMS = {aten.native_batch_norm.default, aten._native_batch_norm_legit.default}
_BATCH_NORM_ARGS = ("input", "weight", "bias", "running_mean", "running_var", "training",
                    "momentum", "eps")


def _batch_norm_updating(func: Any, args: tuple, kwargs: dict) -> Any:
    """A train-mode batch norm with running statistics: its results, with the updated
    statistics written into the running-statistic tensors, as torch does; None for any
    other call (no statistics to update)."""
    bound = dict(zip(_BATCH_NORM_ARGS, args), **kwargs)
    stats = bound["running_mean"], bound["running_var"]
    if not bound["training"] or any(s is None for s in stats):
        return None
    for s in stats:
        if not isinstance(s, JaxTensor):
            raise UnsupportedOpError(
                f"{func} in train mode updates its running statistics in place, and one "
                f"is a torch tensor that is not part of the compiled step "
                f"({type(s).__name__} of shape {tuple(s.shape)}). Call the model through "
                "cstorch.compile's wrapper (compiled_model(x)), whose buffers are the "
                "step's state, or put the layer in eval mode.")
    out, mean, rstd, new_mean, new_var = aten._native_batch_norm_legit_functional.default(
        *(bound[name] for name in _BATCH_NORM_ARGS))
    for target, value in zip(stats, (new_mean, new_var)):
        target._jax = value._jax.astype(jax_dtype(target.dtype))
    return out, mean, rstd


def _decompose(func: Any, args: tuple, kwargs: dict) -> Any:
    table = torch._decomp.decomposition_table
    if func in table:
        return table[func](*args, **kwargs)
    out = func.decompose(*args, **kwargs)
    if out is not NotImplemented:
        return out
    name = str(func).removeprefix("aten.")
    raise UnsupportedOpError(MSG_NO_LOWERING.format(op=func, name=f"aten.{name}"))


def _to_meta(tree: Any) -> Any:
    def meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")
        return x

    return pytree.tree_map(meta, tree)


def _to_jax(tree: Any) -> Any:
    def value(x: Any) -> Any:
        if isinstance(x, JaxTensor):
            return x._jax
        if isinstance(x, torch.Tensor):  # a plain torch tensor: a constant of the program
            return to_jax(x)
        return x

    return pytree.tree_map(value, tree)


def _wrap_like(out: Any, meta: Any, func: Any) -> Any:
    """The lowering's result as JaxTensors with torch's dtypes and checked shapes."""
    if isinstance(meta, torch.Tensor):
        return JaxTensor(_conform(out, meta, func), meta.dtype)
    if isinstance(meta, (tuple, list)):
        return type(meta)(_wrap_like(o, m, func) for o, m in zip(out, meta))
    return out


def _conform(value: Any, meta: torch.Tensor, func: Any) -> jax.Array:
    target = jax_dtype(meta.dtype)
    value = jnp.asarray(value)
    if value.dtype != target and not (jnp.issubdtype(value.dtype, jnp.floating)
                                      and jnp.issubdtype(target, jnp.floating)):
        value = value.astype(target)
    if tuple(value.shape) != tuple(meta.shape):
        raise AssertionError(
            f"torch_bridge: the lowering of {func} returned shape {tuple(value.shape)}, "
            f"torch gives {tuple(meta.shape)}. This is a bug in the lowering.")
    return value
