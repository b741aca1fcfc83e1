"""Custom ``torch.autograd.Function``s, differentiated by their own ``backward``.

A ``torch.autograd.Function`` pairs a forward with the backward torch runs in its place:
a straight-through estimator rounds in forward and passes the gradient through, a
gradient-reversal layer negates it, Model Zoo's ``ClampOpt`` passes it only where the
input lies within the bounds. Differentiating the ops of the forward (what JAX does with
any other torch code) gives other gradients, so torch_bridge runs each Function as a
``jax.custom_vjp`` (:func:`run`):

- its forward runs on :class:`~torch_bridge.JaxTensor` values, so its torch ops lower
  through the op registry like any torch code of a step;
- its backward runs on JaxTensors as well: it receives one gradient per output of the
  forward (the cotangents; zeros, or None after ``ctx.set_materialize_grads(False)``,
  where an output gets none or is marked non-differentiable) and returns one per input,
  which become the inputs' cotangents (None: zero; a tensor argument nested in a list or
  a non-tensor argument gets none, as in torch);
- ``ctx`` is a :class:`FunctionContext`: ``save_for_backward`` / ``saved_tensors``,
  attributes set on it (tensors, also inside lists, tuples and dicts, travel from the
  forward to the backward as the custom_vjp's residuals; other values as they are),
  ``needs_input_grad`` (True where the step differentiates through the input: JAX's
  "perturbed"), ``mark_non_differentiable`` and ``set_materialize_grads``. Functions with
  a separate ``setup_context`` and ``@once_differentiable`` backwards work the same way.

A Function is met in two places:

- torch code of a traced step, on JaxTensors: :func:`apply_to_values` builds the
  custom_vjp there and then;
- a module's forward that torch_bridge exports, on fake tensors: :func:`apply_exporting`
  records the call (:class:`FunctionCall`: the class, the non-tensor arguments and the
  structure) and leaves one ``torch_bridge::autograd_function`` node in the graph, whose
  fake kernel runs the forward on the fake tensors; the node's lowering
  (:func:`run_node`) builds the custom_vjp each time the graph runs.

An exported call's forward runs again where the graph runs, later than where it was
applied: state outside the tensors that it reads and a region set around the call (a
precision level) is captured by the functions registered with
:func:`keep_for_functions`, and set again there.

``torch_bridge._autograd`` routes ``Function.apply`` here (see ``honouring_functions``)
and registers :func:`run_node` as the node's lowering. It hands each of them its
``honouring_functions`` (the ``honouring`` argument), inside which the Function's own
forward and backward run, so that Functions and hooks nested in them are honoured too;
this module does not import ``torch_bridge._autograd``, which imports it.

A forward or backward that reads a tensor's value into Python raises
``TensorReadError``; a backward that returns the wrong number of gradients, or writes
its input in place (``ctx.mark_dirty``), raises ``UnsupportedOpError``; each message
names the Function and the fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch.utils._pytree as pytree
from jax import lax
from jax.custom_derivatives import SymbolicZero

from cerebrax._runtime import RUNTIME
from cerebrax._tree import Skeleton, combine, partition_leaves
from cerebrax.errors import TensorReadError, UnsupportedOpError

from ._tensor import JaxTensor, mark_used, paused_recording
from .ops._custom import call, register_call
from .ops._dtypes import export_dtype, to_jax

__all__ = ["FunctionCall", "FunctionContext", "apply_exporting", "apply_to_values",
           "describe", "keep_for_functions", "run", "run_node"]

# ``torch_bridge._autograd.honouring_functions``, as its callers hand it in: the context
# the Function's own forward and backward run in.
Honouring = Callable[[], contextlib.AbstractContextManager[None]]

MSG_READS = """\
The {part} of the custom autograd.Function {name} reads a tensor's value into Python
({detail}). A compiled step runs the {part} once, while its graph is built, when no
value is known yet. Compute with tensors instead: torch.where(cond, a, b) for a branch
on values, a tensor in place of .item() or float(t); or read the value in a step
closure."""

MSG_GRADIENT_COUNT = """\
The backward of the custom autograd.Function {name} returned {got} gradient(s), but its
forward has {expected} input(s) (torch raises here too). Return one gradient per input
of forward, in order, with None for the inputs that get none (non-tensor arguments
included), e.g. `return grad_x, None`."""

MSG_NOT_A_TENSOR = """\
The backward of the custom autograd.Function {name} returned a gradient for input
{index} of its forward, which is not a tensor ({kind}); torch raises here too. Return
None in that position."""

MSG_GRADIENT_SHAPE = """\
The backward of the custom autograd.Function {name} returned a gradient of shape
{got} for input {index} of its forward, of shape {want}; torch raises here too. Return
a gradient of the input's shape (or one that sums to it along broadcast dims)."""

MSG_DIRTY = """\
The forward of the custom autograd.Function {name} writes into its input in place
(ctx.mark_dirty), which cerebrax does not reproduce in a compiled step. Return a new
tensor instead, e.g. `return x.clone().mul_(2)` without mark_dirty."""

MSG_LEAKED = """\
The backward of the custom autograd.Function {name} uses a tensor of its forward that
did not reach it through ctx. Keep what backward needs with ctx.save_for_backward(...)
or as an attribute of ctx (a tensor, or a list, tuple or dict of tensors), not in
another object, the Function class or a global."""

MSG_OUTPUT = """\
The forward of the custom autograd.Function {name} returned {kind}; a Function returns a
tensor or a tuple (of tensors and other values), as torch requires."""

_READ_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                jax.errors.TracerIntegerConversionError)


# ---- state outside the tensors -----------------------------------------------------------
def keep_for_functions(capture: Callable[[], tuple[Hashable, Callable[[], Any]]]) -> None:
    """Registers ``capture``, called where a custom Function is applied: it returns
    ``(key, restore)``, a hashable description of state outside the tensors that the
    Function's forward may read (cerebrax registers its precision optimization level,
    ``current_pol()``, which a ``pol(level=...)`` region sets), and a function giving a
    context manager that sets that state again. A Function applied in an exported
    forward runs its forward again when the graph runs, outside that region: there it
    runs inside ``restore()``. Registering the same function twice registers it once."""
    if capture not in RUNTIME.bridge_keepers:
        RUNTIME.bridge_keepers.append(capture)


@contextlib.contextmanager
def _restored(state: tuple) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for _, restore in state:
            stack.enter_context(restore())
        yield


# ---- ctx -------------------------------------------------------------------------------
class FunctionContext:
    """The ``ctx`` a Function's ``forward`` (or ``setup_context``) and ``backward`` get.

    Attributes:
      needs_input_grad: one bool per input of forward: whether the step differentiates
        through it (a tensor whose value depends on a trained parameter).
      materialize_grads: whether backward gets zeros (True, torch's default) or None
        for an output without a gradient.
    """

    def __init__(self, needs_input_grad: tuple[bool, ...], name: str):
        self.needs_input_grad = needs_input_grad
        self.materialize_grads = True
        self.to_save: tuple = ()
        self._name = name
        self._non_differentiable: Any = ()

    def save_for_backward(self, *tensors: Any) -> None:
        """Keeps ``tensors`` for backward (``ctx.saved_tensors``)."""
        self.to_save = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        """Keeps ``tensors`` for a forward-mode rule (kept, unused: no jvp here)."""
        self.saved_for_forward = tensors

    @property
    def saved_tensors(self) -> tuple:
        """What ``save_for_backward`` kept."""
        return tuple(self.to_save)

    saved_variables = saved_tensors

    def mark_non_differentiable(self, *outputs: Any) -> None:
        """Marks outputs of forward that get no gradient (backward gets zeros or None)."""
        self._non_differentiable = tuple(outputs)

    def take_non_differentiable(self) -> set[int]:
        """The ids of the outputs marked non-differentiable, forgetting them (output
        objects are not for the custom_vjp's residuals)."""
        marked, self._non_differentiable = self._non_differentiable, ()
        return {id(t) for t in marked}

    def set_materialize_grads(self, value: bool) -> None:
        """False: backward gets None (not zeros) for outputs without a gradient."""
        self.materialize_grads = bool(value)

    def mark_dirty(self, *tensors: Any) -> None:
        """An in-place write into an input: refused (see ``MSG_DIRTY``)."""
        raise UnsupportedOpError(MSG_DIRTY.format(name=self._name))


# ---- one call ------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class FunctionCall:
    """One ``Function.apply(...)``: everything about it but the tensors' values.

    Attributes:
      function: the ``torch.autograd.Function`` subclass.
      skeleton: ``(args, kwargs)`` as forward receives them, but for their tensors
        (:func:`cerebrax._tree.partition` over torch's pytree), with each tensor's
        torch dtype.
      inputs: per tensor leaf, its position among forward's inputs (positional
        arguments, then keyword arguments), or None for a tensor nested in an argument
        (a list of tensors): torch gives those no gradient.
      n_inputs: how many inputs forward has (backward returns that many gradients).
      requires_grad: per tensor leaf, whether it required grad (the fake run's ctx).
      outputs: per output of forward, a torch dtype (a tensor) or ``("value", v)``;
        set by the forward's first run.
      tuple_output: whether forward returned a tuple.
      differentiable: per tensor output, whether it carries a gradient (not marked
        non-differentiable, floating point); set by the fake run.
      state: ``(key, restore)`` per function of :func:`keep_for_functions`, captured
        where the Function was applied.
    """

    function: type
    skeleton: Skeleton
    inputs: tuple[int | None, ...]
    n_inputs: int
    requires_grad: tuple[bool, ...]
    outputs: tuple | None = None
    tuple_output: bool = False
    differentiable: tuple[bool, ...] = ()
    state: tuple = ()

    @property
    def name(self) -> str:
        """The Function's qualified name, for messages."""
        return f"{self.function.__module__}.{self.function.__qualname__}"

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        """Per tensor leaf, its torch dtype."""
        return self.skeleton.torch_dtypes

    @property
    def setup_context(self) -> bool:
        """Whether forward leaves ctx to a separate ``setup_context`` staticmethod."""
        return torch.autograd.function._is_setup_context_defined(self.function.setup_context)

    def arguments(self, tensors: Sequence[Any]) -> tuple[tuple, dict]:
        """``(args, kwargs)`` for forward, with ``tensors`` in the tensor slots."""
        return combine(tensors, self.skeleton)

    def needs_input_grad(self, perturbed: Sequence[bool]) -> tuple[bool, ...]:
        """Per input of forward, whether a differentiated tensor comes in there."""
        needs = [False] * self.n_inputs
        for position, flag in zip(self.inputs, perturbed):
            if position is not None and flag:
                needs[position] = True
        return tuple(needs)

    def key(self) -> Any:
        """A hashable description: equal keys, equal calls (see ``register_call``)."""
        return (self.function, str(self.skeleton.treedef),
                tuple(_frozen(x) for x in self.skeleton.leaves),
                self.inputs, self.dtypes, self.requires_grad, tuple(k for k, _ in self.state))

    def fake(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The graph node's outputs on fake tensors: forward run on them."""
        ctx = FunctionContext(self.needs_input_grad(self.requires_grad), self.name)
        env = getattr(torch._guards.detect_fake_mode(inputs), "shape_env", None)
        read = len(env.pending_fresh_unbacked_symbols) if env is not None else 0
        with torch.no_grad(), _restored(self.state):
            outputs = [torch.empty_like(t) for t in self.forward(ctx, inputs)]
        if env is not None and len(env.pending_fresh_unbacked_symbols) > read:
            # .item() on a fake tensor gives a symbol for the value instead of raising
            del env.pending_fresh_unbacked_symbols[read:]
            raise TensorReadError(MSG_READS.format(part="forward", name=self.name,
                                                   detail="e.g. .item()"))
        return outputs

    def forward(self, ctx: FunctionContext, tensors: Sequence[Any]) -> list:
        """Runs the Function's forward (and ``setup_context``) with ``tensors`` in the
        tensor slots; records the structure of its result (:attr:`outputs`,
        :attr:`differentiable`) and returns the tensors of the result."""
        args, kwargs = self.arguments(tensors)
        if self.setup_context:
            out = self.function.forward(*args, **kwargs)
            self.function.setup_context(ctx, (*args, *kwargs.values()), out)
        else:
            out = self.function.forward(ctx, *args, **kwargs)
        self.tuple_output = isinstance(out, tuple)
        if not self.tuple_output and not isinstance(out, torch.Tensor):
            raise UnsupportedOpError(MSG_OUTPUT.format(name=self.name,
                                                       kind=type(out).__name__))
        items = out if self.tuple_output else (out,)
        self.outputs = tuple(x.dtype if isinstance(x, torch.Tensor) else ("value", x)
                             for x in items)
        results = [x for x in items if isinstance(x, torch.Tensor)]
        fixed = ctx.take_non_differentiable()
        self.differentiable = tuple(id(t) not in fixed and t.is_floating_point()
                                    for t in results)
        return results

    def rebuild(self, tensors: Sequence[Any]) -> Any:
        """Forward's result with ``tensors`` (the outputs that are tensors) in place."""
        it = iter(tensors)
        items = tuple(x[1] if isinstance(x, tuple) else next(it) for x in self.outputs)
        return items if self.tuple_output else items[0]


def describe(function: type, args: tuple, kwargs: dict) -> tuple[FunctionCall, list]:
    """The :class:`FunctionCall` of ``function.apply(*args, **kwargs)`` and its tensors."""
    if torch.autograd.function._is_setup_context_defined(function.setup_context):
        bound = inspect.signature(function.forward).bind(*args, **kwargs)
        bound.apply_defaults()
        args, kwargs = bound.args, bound.kwargs
    inputs = (*args, *kwargs.values())
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    positions: list[int | None] = []
    for k, value in enumerate(inputs):
        if isinstance(value, torch.Tensor):
            positions.append(k)
        else:
            positions += [None] * len(pytree.tree_leaves(value))
    tensors, skeleton = partition_leaves(
        leaves, spec, lambda x: (x, x.dtype) if isinstance(x, torch.Tensor) else None)
    entry = FunctionCall(
        function, skeleton,
        tuple(p for p, x in zip(positions, leaves) if isinstance(x, torch.Tensor)),
        len(inputs), tuple(bool(t.requires_grad) for t in tensors),
        state=tuple(capture() for capture in RUNTIME.bridge_keepers))
    return entry, tensors


def _frozen(x: Any) -> Any:
    try:
        hash(x)
    except TypeError:
        return (type(x).__name__, repr(x))
    return (type(x).__name__, x)


# ---- where a Function is applied -------------------------------------------------------------
def apply_to_values(function: type, args: tuple, kwargs: dict, honouring: Honouring) -> Any:
    """``function.apply`` on JaxTensors (torch code of a traced step); its forward and
    backward run inside ``honouring()``."""
    entry, tensors = describe(function, args, kwargs)
    mark_used(tensors)
    arrays = [to_jax(t) for t in tensors]
    outputs = run(entry, arrays, list(entry.dtypes), honouring)
    dtypes = [d for d in entry.outputs if not isinstance(d, tuple)]
    return entry.rebuild([JaxTensor(a, d) for a, d in zip(outputs, dtypes)])


def apply_exporting(function: type, args: tuple, kwargs: dict) -> Any:
    """``function.apply`` while a module is exported: one graph node (see the module
    docstring)."""
    entry, tensors = describe(function, args, kwargs)
    index = register_call(entry, entry.key())
    entry = call(index)
    outputs = torch.ops.torch_bridge.autograd_function(index, list(tensors))
    return entry.rebuild(outputs)


def run_node(index: int, inputs: list, honouring: Honouring) -> list:
    """The outputs of an ``autograd_function(index, inputs)`` node where its graph runs
    (its lowering, which ``torch_bridge._autograd`` registers): :func:`run` on the
    call recorded at ``index``."""
    entry = call(index)
    dtypes = [export_dtype(x.dtype) if d.is_floating_point else d
              for x, d in zip(inputs, entry.dtypes)]
    return run(entry, list(inputs), dtypes, honouring)


# ---- the custom_vjp --------------------------------------------------------------------------
def run(entry: FunctionCall, arrays: list, dtypes: list[torch.dtype],
        honouring: Honouring) -> list:
    """The Function's tensor outputs on ``arrays`` (JAX values of torch dtypes
    ``dtypes``), as a ``jax.custom_vjp`` whose backward is the Function's own; its
    forward and backward run inside ``honouring()``."""
    inputs = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in arrays]
    arrays = [a if p is not None else lax.stop_gradient(a)  # nested: no gradient
              for a, p in zip(arrays, entry.inputs)]
    outputs: list = []  # per tensor output: (shape, JAX dtype, torch dtype, differentiable)

    def forward(values: Sequence[Any], perturbed: Sequence[bool]) -> tuple[list, Any]:
        ctx = FunctionContext(entry.needs_input_grad(perturbed), entry.name)
        tensors = [JaxTensor(v, d) for v, d in zip(values, dtypes)]
        with _part(entry, "forward", honouring), _restored(entry.state):
            results = entry.forward(ctx, tensors)
        values = [jnp.asarray(to_jax(t)) for t in results]  # a constant result too
        outputs[:] = [(v.shape, v.dtype, t.dtype, differentiable)
                      for v, t, differentiable in zip(values, results, entry.differentiable)]
        return values, ctx

    @jax.custom_vjp
    def function(*values: Any) -> list:
        return forward(values, [False] * len(values))[0]

    def function_fwd(*primals: Any) -> tuple[list, Any]:
        values, ctx = forward([p.value for p in primals], [p.perturbed for p in primals])
        return values, _Residuals.of(ctx)

    def function_bwd(residuals: _Residuals, cotangents: list) -> tuple:
        ctx = residuals.context()
        grads = [_output_grad(ct, info, ctx.materialize_grads)
                 for ct, info in zip(cotangents, outputs)]
        it = iter(grads)
        grads = [None if isinstance(x, tuple) else next(it) for x in entry.outputs]
        with _part(entry, "backward", honouring):
            result = entry.function.backward(ctx, *grads)
        return tuple(_input_cotangents(entry, result, inputs))

    function.defvjp(function_fwd, function_bwd, symbolic_zeros=True)
    return function(*arrays)


def _output_grad(cotangent: Any, info: tuple, materialize: bool) -> Any:
    """The gradient backward gets for one tensor output (see the module docstring)."""
    shape, dtype, torch_dtype, differentiable = info
    if differentiable and not isinstance(cotangent, SymbolicZero):
        return JaxTensor(cotangent, torch_dtype)
    if not materialize:
        return None
    return JaxTensor(jnp.zeros(shape, dtype), torch_dtype)


def _input_cotangents(entry: FunctionCall, result: Any, inputs: list) -> list:
    """Backward's result as cotangents of the call's tensor leaves (``inputs``: their
    shapes and dtypes); None where there is none."""
    grads = list(result) if isinstance(result, tuple) else [result]
    if len(grads) < entry.n_inputs or any(g is not None for g in grads[entry.n_inputs:]):
        raise UnsupportedOpError(MSG_GRADIENT_COUNT.format(
            name=entry.name, got=len(grads), expected=entry.n_inputs))
    tensor_inputs = set(entry.inputs)
    for k, g in enumerate(grads[:entry.n_inputs]):
        if g is not None and k not in tensor_inputs:
            raise UnsupportedOpError(MSG_NOT_A_TENSOR.format(
                name=entry.name, index=k, kind=type(_input_value(entry, k)).__name__))
    out = []
    for position, aval in zip(entry.inputs, inputs):
        g = None if position is None else grads[position]
        out.append(None if g is None or not _differentiable(aval.dtype)
                   else _as_cotangent(entry, position, g, aval))
    return out


def _input_value(entry: FunctionCall, k: int) -> Any:
    """Input ``k`` of forward (its non-tensor value)."""
    args, kwargs = entry.arguments([None] * len(entry.dtypes))
    return (*args, *kwargs.values())[k]


def _differentiable(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def _as_cotangent(entry: FunctionCall, k: int, grad: Any, aval: Any) -> jax.Array:
    """A gradient returned for input ``k``: summed to its shape (as torch does where it
    broadcasts to it) and cast to its dtype."""
    value = jnp.asarray(to_jax(grad) if isinstance(grad, torch.Tensor) else grad)
    shape = tuple(aval.shape)
    if value.shape != shape:
        try:
            broadcast = jnp.broadcast_shapes(value.shape, shape) == value.shape
        except ValueError:
            broadcast = False
        if not broadcast:
            raise UnsupportedOpError(MSG_GRADIENT_SHAPE.format(
                name=entry.name, got=tuple(value.shape), want=shape, index=k))
        value = _sum_to(value, shape)
    return value.astype(aval.dtype)


def _sum_to(value: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    lead = value.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and value.shape[lead + i] != 1)
    return jnp.sum(value, axis=axes, keepdims=False).reshape(shape)


@contextlib.contextmanager
def _part(entry: FunctionCall, part: str, honouring: Honouring) -> Iterator[None]:
    """Runs the Function's ``part`` (forward or backward): its JaxTensors are not the
    step's (paused recording), nested Functions are honoured (``honouring()``), and a
    read of a value names the Function."""
    try:
        with paused_recording(), honouring():
            yield
    except _READ_ERRORS as e:
        detail = str(e).strip().splitlines()[0]
        raise TensorReadError(MSG_READS.format(part=part, name=entry.name,
                                               detail=detail)) from e
    except jax.errors.UnexpectedTracerError as e:
        raise UnsupportedOpError(MSG_LEAKED.format(name=entry.name)) from e


# ---- residuals -------------------------------------------------------------------------------
@jax.tree_util.register_pytree_node_class
class _Residuals:
    """A ctx on its way from forward to backward: its tensors as arrays (the
    custom_vjp's residuals), everything else as Python data."""

    def __init__(self, arrays: list, layout: _Layout):
        self.arrays = arrays
        self.layout = layout

    @classmethod
    def of(cls, ctx: FunctionContext) -> _Residuals:
        leaves, spec = pytree.tree_flatten(dict(vars(ctx)))
        arrays = [x._jax for x in leaves if isinstance(x, JaxTensor)]
        kept = [(x.dtype,) if isinstance(x, JaxTensor) else x for x in leaves]
        return cls(arrays, _Layout(spec, [isinstance(x, JaxTensor) for x in leaves], kept))

    def context(self) -> FunctionContext:
        """The ctx backward gets: forward's, its tensors as JaxTensors again."""
        it = iter(self.arrays)
        leaves = [JaxTensor(next(it), x[0]) if tensor else x
                  for tensor, x in zip(self.layout.tensors, self.layout.kept)]
        ctx = FunctionContext.__new__(FunctionContext)
        vars(ctx).update(pytree.tree_unflatten(leaves, self.layout.spec))
        return ctx

    def tree_flatten(self) -> tuple[tuple, Any]:
        return tuple(self.arrays), self.layout

    @classmethod
    def tree_unflatten(cls, layout: _Layout, arrays: Any) -> _Residuals:
        return cls(list(arrays), layout)


@dataclasses.dataclass(eq=False)
class _Layout:
    """The Python part of :class:`_Residuals` (compared by identity)."""

    spec: Any
    tensors: list[bool]
    kept: list
