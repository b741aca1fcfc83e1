"""Registered state: the mutable slots that a traced step threads through its program.

Every stateful cerebrax object (a compiled model's parameters and buffers, an
optimizer's state and hyperparameters, a scheduler's step counter, a grad scaler's
loss scale, a metric's accumulators) keeps its values in :class:`StateRef` slots.
Outside a traced step a slot holds concrete JAX arrays. Inside a traced step every
read and write goes to the active trace context, which maps each slot to the tracer
that currently stands for it; the step's program takes all slots in and gives all
slots back, so imperative cstorch code becomes one pure function.

A compiled parameter may stand for an object of the user's model, a torch module's
``nn.Parameter`` (:func:`alias_parameter`): optimizers take the original object, and a
traced step hands the links to its trace context (:func:`parameter_aliases`).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._placement import readable_tree
from .._runtime import RUNTIME
from ..errors import StateError
from ._active_context import active_context
from ._interop import as_jax

__all__ = ["Parameter", "StateRef", "add_read_guard", "alias_parameter", "aliased_parameter",
           "constant_on_host", "current_generation", "live_optimizers", "live_refs",
           "optimized_parameters", "parameter_aliases", "parameter_hooks",
           "register_optimizer", "same_structure", "set_state_device"]


_IDS = itertools.count()  # creation order of slots and optimizers (never reset)

MSG_STATE_IN_STEP = """\
{what} was created inside a traced step. A traced step is captured once as a static
graph, so all state (models, optimizers, schedulers, grad scalers, metrics) must
exist before the step is first called.

Wrong:
    @cstorch.trace
    def step(x):
        metric = cstorch.metrics.AccuracyMetric("acc")   # created on every trace
Right:
    metric = cstorch.metrics.AccuracyMetric("acc")
    @cstorch.trace
    def step(x):
        metric(labels, predictions)
"""


def add_read_guard(guard: Callable[[StateRef], None]) -> None:
    """Calls ``guard(ref)`` before every read of a slot outside a traced step."""
    RUNTIME.read_guards.append(guard)


def current_generation() -> int:
    """The generation of live state; ``cstorch.reset()`` starts the next one."""
    return RUNTIME.generation


def set_state_device(device: jax.Device | None) -> None:
    """Where new slots place their values (the backend calls this when it starts)."""
    RUNTIME.state_device = device


def _state_device() -> jax.Device:
    return RUNTIME.state_device or jax.local_devices()[0]


def as_state_leaf(x: Any) -> jax.Array:
    """A fresh, strongly typed JAX array holding ``x``, owned by the state slot.

    The slot must own its buffer: a traced step donates state buffers, which would
    delete an array the caller still holds, or fail if two leaves shared a buffer.
    Weakly typed scalars (``jnp.asarray(0.1)``) would change the program's input
    signature once a step returns a strongly typed value, forcing a recompile; so would
    an uncommitted array, since step outputs are committed to the backend's device.
    """
    # Built on the host and copied to the device, never by an eager JAX operation: each
    # of those compiles a small program per shape.
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        dtype = np.bool_ if isinstance(x, bool) else (
            np.int32 if isinstance(x, int) else np.float32
        )
        return jax.device_put(np.array(x, dtype=dtype), _state_device())
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        arr = jax.random.wrap_key_data(jnp.array(jax.random.key_data(x), copy=True),
                                       impl=jax.random.key_impl(x))
    elif isinstance(x, jax.Array) and not x.weak_type:
        if not x.is_fully_addressable:
            return jnp.array(x, copy=True)  # laid out on a mesh that spans processes
        return jax.device_put(x, _state_device(), may_alias=False)
    elif isinstance(x, (np.ndarray, np.generic)):
        return jax.device_put(np.array(x, copy=True), _state_device())
    elif isinstance(x, jax.Array) and x.is_fully_addressable:  # weakly typed: a scalar
        return jax.device_put(np.array(x), _state_device())
    else:
        arr = jnp.array(x, copy=True)
        if arr.weak_type:
            arr = jax.lax.convert_element_type(arr, arr.dtype)
    if not arr.is_fully_addressable:
        return arr  # already laid out on a mesh that spans processes; it stays there
    return jax.device_put(arr, _state_device())


def _broadcast_in_dim(x: np.ndarray, *, shape: tuple, broadcast_dimensions: tuple,
                      sharding: Any = None, **_: Any) -> np.ndarray | None:
    if sharding is not None:
        return None
    kept = [1] * len(shape)
    for axis, size in zip(broadcast_dimensions, x.shape):
        kept[axis] = size
    return np.broadcast_to(x.reshape(kept), shape)


def _convert_element_type(x: np.ndarray, *, new_dtype: Any, sharding: Any = None,
                          **_: Any) -> np.ndarray | None:
    # Only where the value is exactly representable in both dtypes: how a cast rounds,
    # saturates or maps NaN is XLA's to say, not numpy's.
    out = x.astype(new_dtype)
    if sharding is not None or not np.array_equal(out.astype(x.dtype), x):
        return None
    return out


_HOST_RULES: dict[Any, Callable[..., np.ndarray | None]] = {
    jax.lax.broadcast_in_dim_p: _broadcast_in_dim,
    jax.lax.convert_element_type_p: _convert_element_type,
    jax.lax.copy_p: lambda x, **_: x,
}


def _host_side(leaves: list) -> bool:
    """Whether every array among ``leaves`` lives in this process's CPU memory: there, a
    value made on the host is already where the device keeps it. (On an accelerator the
    program that makes the state on the device is cheaper than copying every moment
    over, and a mesh of several processes is the program's to lay out.)"""
    return all(x.is_fully_addressable and all(d.platform == "cpu" for d in x.devices())
               for x in leaves if isinstance(x, jax.Array))


def constant_on_host(fn: Callable[..., Any], *args: Any) -> Any | None:
    """``fn(*args)`` as numpy arrays computed on the host, where every output is a
    constant that does not read the arguments' values (a zero moment, a step count: what
    an optax ``init`` mostly makes) and the arguments live on CPU devices; None
    otherwise, and the caller runs ``fn`` as a program.

    ``fn`` is traced, not compiled: compiling even a small program costs 0.1 s. The
    values are exact: fills of a literal, and casts only where the value is exactly
    representable in both dtypes.
    """
    if not _host_side(jax.tree.leaves(args)):
        return None
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    if not _host_side(list(closed.consts)):
        return None
    consts = dict(zip(closed.jaxpr.constvars, closed.consts))
    known: dict[Any, np.ndarray] = {}

    def read(atom: Any) -> np.ndarray | None:
        # A jaxpr atom is a variable or a literal; only a literal holds its value. (Not
        # isinstance of jax.extend.core.Literal: importing jax.extend costs 25 ms.)
        if hasattr(atom, "val"):
            return np.asarray(atom.val, atom.aval.dtype)
        if atom in consts:
            return np.asarray(consts[atom])
        return known.get(atom)  # None: an argument, or what no rule computed

    for eqn in closed.jaxpr.eqns:
        rule = _HOST_RULES.get(eqn.primitive)
        inputs = [read(atom) for atom in eqn.invars]
        if rule is None or len(inputs) != 1 or inputs[0] is None:
            return None
        out = rule(inputs[0], **eqn.params)
        if out is None:
            return None
        known[eqn.outvars[0]] = out
    outs = [read(atom) for atom in closed.jaxpr.outvars]
    leaves, treedef = jax.tree.flatten(shapes)
    if any(out is None or out.shape != leaf.shape or out.dtype != leaf.dtype
           for out, leaf in zip(outs, leaves, strict=True)):
        return None
    # Each leaf a buffer of its own (a fill is a broadcast view until copied).
    return jax.tree.unflatten(treedef, [np.array(out) for out in outs])


def same_structure(old: Any, new: Any) -> str | None:
    """Describes how ``new`` differs from ``old`` in tree structure, shape or dtype."""
    old_leaves, old_def = jax.tree.flatten(old)
    new_leaves, new_def = jax.tree.flatten(new)
    if old_def != new_def:
        return f"tree structure {new_def} instead of {old_def}"
    for a, b in zip(old_leaves, new_leaves):
        if jnp.shape(a) != jnp.shape(b):
            return f"shape {jnp.shape(b)} instead of {jnp.shape(a)}"
        if jnp.result_type(a) != jnp.result_type(b):
            return f"dtype {jnp.result_type(b)} instead of {jnp.result_type(a)}"
    return None


class StateRef:
    """One named slot of registered state holding a pytree of JAX arrays.

    Args:
      value: the initial pytree (arrays or Python numbers).
      name: a readable name used in error messages, e.g. ``"model.fc1.weight"``.
      skippable: whether a step skipped by dynamic loss scaling restores this slot
        (parameters, optimizer state, scheduler counters) or not (loss scale,
        metric accumulators).
    """

    __slots__ = ("_value", "name", "skippable", "generation", "index", "__weakref__")

    def __init__(self, value: Any, *, name: str, skippable: bool = False):
        if active_context() is not None:
            raise StateError(MSG_STATE_IN_STEP.format(what=f"State {name!r}"))
        self._value = jax.tree.map(as_state_leaf, value)
        self.name = name
        self.skippable = skippable
        self.generation = RUNTIME.generation
        self.index = next(_IDS)
        RUNTIME.slots[self.index] = weakref.ref(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @property
    def stored(self) -> Any:
        """The arrays the slot holds, as they are: what a step's program takes in (no
        read guard, no gathering from other processes; inside a traced step, the value
        from before the step). For cerebrax's own machinery; a user reads ``value``."""
        return self._value

    def store(self, value: Any) -> None:
        """Makes ``value`` (a step's new value for the slot, or the same arrays moved to
        another layout) the slot's value as it is, without the checks of ``value =``."""
        self._value = value

    def check_generation(self) -> None:
        if self.generation != RUNTIME.generation:
            raise StateError(
                f"{self.name!r} was created under a backend that has since been reset "
                "by cerebrax.reset(). Create the model, optimizer, schedulers and metrics "
                "again after the reset."
            )

    @property
    def value(self) -> Any:
        ctx = active_context()
        if ctx is not None:
            return ctx.read(self)
        for guard in RUNTIME.read_guards:
            guard(self)
        return readable_tree(self._value)  # gathered if split over processes

    @value.setter
    def value(self, new: Any) -> None:
        ctx = active_context()
        if ctx is not None:
            ctx.write(self, new)
            return
        new = jax.tree.map(as_state_leaf, new)
        problem = same_structure(self._value, new)
        if problem is not None:
            raise StateError(
                f"Cannot assign a value with {problem} to {self.name!r}: a compiled step "
                "has a static graph, so state keeps its structure, shapes and dtypes."
            )
        self._value = new


class Parameter(StateRef):
    """A trainable array of a compiled model, addressed by its state-dict name.

    Optimizers take lists of parameters (``compiled.parameters()``). Inside a traced
    step ``p.value`` is the tracer of the parameter and ``p.grad`` its gradient once
    the loss has been marked (``cstorch.backward(loss)``).
    """

    __slots__ = ("requires_grad", "owner")

    def __init__(self, value: Any, *, name: str, requires_grad: bool = True, owner=None):
        super().__init__(value, name=name, skippable=True)
        self.requires_grad = requires_grad
        self.owner = owner

    @property
    def shape(self) -> tuple[int, ...]:
        """The parameter's shape (read from the stored array, without a device sync)."""
        return tuple(self._value.shape)

    @property
    def dtype(self) -> np.dtype:
        """The dtype the parameter is stored in (mixed precision casts it only where the
        model computes)."""
        return self._value.dtype

    @property
    def data(self) -> jax.Array:
        """The parameter's value, as :attr:`value`. Assigning to it sets the value, as
        ``p.data = ...`` does in torch, except that the shape and dtype must stay."""
        return self.value

    @data.setter
    def data(self, new: Any) -> None:
        self.value = new

    @property
    def grad(self) -> jax.Array | None:
        """The parameter's gradient in a traced step; None outside a traced step.

        Inside a step it exists after ``cstorch.backward(loss)``, in the calls that
        consume gradients (``optimizer.step()``, gradient clipping), and in torch code
        after ``loss.backward()``, where it is the torch tensor of the original torch
        parameter's ``.grad``. Elsewhere in the step, and for a trainable parameter that
        no optimizer holds, reading it raises :class:`~cerebrax.errors.StateError`. It is
        None for a frozen parameter (``requires_grad=False``) and after ``zero_grad()``.
        Assigning sets the gradient (None clears it), inside a traced step only.
        """
        ctx = active_context()
        if ctx is None:
            return None
        return ctx.user_grad(self)

    @grad.setter
    def grad(self, new: jax.Array | None) -> None:
        ctx = active_context()
        if ctx is None:
            raise StateError(
                f"Gradients of {self.name!r} exist only inside a traced step, after "
                "cstorch.backward(loss)."
            )
        ctx.set_grad(self, None if new is None else as_jax(new))

    def __jax_array__(self) -> jax.Array:
        return self.value

    def __getattr__(self, name: str) -> Any:
        # Torch code in a traced step that takes parameters from optimizer.param_groups
        # uses them as torch tensors (p.detach(), p.add_(...)): while the step is traced,
        # a compiled torch module's parameter answers the torch tensor that stands for
        # its current value. Only attributes a Parameter lacks come here.
        view = RUNTIME.torch_views.get(self) if not name.startswith("__") else None
        if view is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(view, name)


def live_refs() -> list[StateRef]:
    """Every registered slot that is still alive, in creation order."""
    out = []
    for index, wr in list(RUNTIME.slots.items()):
        ref = wr()
        if ref is None or ref.generation != RUNTIME.generation:
            RUNTIME.slots.pop(index, None)
        else:
            out.append(ref)
    return out


def register_optimizer(optimizer: Any) -> None:
    """Records a live optimizer; its parameters are differentiated by traced steps."""
    RUNTIME.optimizers[next(_IDS)] = weakref.ref(optimizer)


def live_optimizers() -> list[Any]:
    """Every registered optimizer that is still alive and of the current generation."""
    out = []
    for key, wr in list(RUNTIME.optimizers.items()):
        opt = wr()
        if opt is None or getattr(opt, "generation", -1) != RUNTIME.generation:
            RUNTIME.optimizers.pop(key, None)
        else:
            out.append(opt)
    return out


def optimized_parameters() -> list[Parameter]:
    """The parameters that traced steps differentiate, in a stable order.

    These are the parameters of every live optimizer's param groups with
    ``requires_grad``; with no optimizer, every live trainable parameter (so that
    ``cstorch.backward`` alone still yields gradients).
    """
    params: dict[Parameter, None] = {}
    optimizers = live_optimizers()
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    params[p] = None
    if not optimizers:
        params = {r: None for r in live_refs() if isinstance(r, Parameter) and r.requires_grad}
    return list(params)


# ---- the user's objects that compiled parameters stand for ---------------------------------
def alias_parameter(original: Any, p: Parameter) -> None:
    """Records that ``original``, an object of the user's model (a torch module's
    ``nn.Parameter``), stands for the compiled parameter ``p``: an optimizer given
    ``original`` trains ``p`` (:func:`aliased_parameter`), and torch code in a traced step
    sees ``p``'s value and gradient through it (the traced step hands
    :func:`parameter_aliases` to its trace context). Compiling the module again links
    ``original`` to the new parameter instead.

    The link lasts while ``original`` lives, until ``cstorch.reset()``, and keeps ``p``
    (and so its compiled model) alive meanwhile: a script that keeps only the torch module
    still builds optimizers from its parameters, and its ``state_dict()`` still reads the
    compiled state.
    """
    RUNTIME.parameter_aliases[original] = p


def aliased_parameter(obj: Any) -> Parameter | None:
    """The compiled parameter ``obj`` stands for (:func:`alias_parameter`), or None."""
    return RUNTIME.parameter_aliases.get(obj)


def parameter_aliases() -> list[tuple[Any, Parameter]]:
    """Every ``(original, compiled parameter)`` link whose original lives, in the order
    the originals were first linked."""
    return RUNTIME.parameter_aliases.items()


def parameter_hooks() -> tuple:
    """The gradient hooks registered now on the originals of :func:`parameter_aliases`:
    which hooks, on which torch parameter, in order. A traced step applies the hooks it
    saw when it was built, and checks before each call that they are still the same."""
    return tuple((id(t), tuple(t._backward_hooks or {}))
                 for t, _ in parameter_aliases() if t._backward_hooks)
