"""The static-graph step: ``@cstorch.trace`` turns a training step into one jitted program.

cstorch code is imperative: a model, an optimizer and a scheduler mutate. JAX code is
functional. :func:`trace` bridges the two. On the first call it snapshots every
registered state slot (:mod:`cerebrax._step`) and builds

    program(all state, step inputs) -> (new state, step outputs, closure arguments)

as ONE ``jax.jit`` function whose state argument is donated (no second copy of the
weights). Inside the program the user's step runs once, under ``jax.vjp`` with respect
to the parameters that optimizers hold. ``cstorch.backward(loss)`` only marks the loss;
calls that consume gradients (``optimizer.step``, ``scaler.step``, clipping,
``lr_scheduler.step``, ...) are recorded and replayed in program order once the
gradients exist. Everything computed in the forward pass that must survive it (state
updates such as BatchNorm statistics or metric counts, the step's outputs, closure and
deferred-call arguments) leaves the differentiated function as auxiliary output.
"""

from __future__ import annotations

import functools
import inspect
import os
import time
import types
from collections.abc import Callable
from typing import Any

import jax

from ... import _startup_gc, _step, wse
from ..._filters import is_array, is_torch_tensor
from ..._placement import put_many
from ..._precision import torch_autocast_state
from ..._runtime import RUNTIME
from ..._step import DeferredValue, StepRecord, TraceContext, torch_origin, torch_to_jax
from ...backend import Backend, current_backend, flags_report, get_or_create_backend
from ..._tree import ARRAY, Skeleton, combine, partition
from ...errors import ConfigError, RecompileError, StateError, TensorReadError

__all__ = ["Retrace", "TracedStep", "before_build", "compile_step", "trace", "write_artifacts"]

MSG_TENSOR_READ = """\
It is not allowed to read a tensor's contents outside of a step closure.

The traced step `{name}` is captured once as a static graph; inside it tensors have no
values yet, so they cannot be converted to Python numbers, printed as numbers, or used
in a Python `if`. {detail}

Wrong:
    @cstorch.trace
    def step(x, y):
        loss = ...
        print(float(loss))            # reads a value inside the step
Right:
    @cstorch.step_closure
    def print_loss(loss):
        print(float(loss))            # runs after the step, with the value
    @cstorch.trace
    def step(x, y):
        loss = ...
        print_loss(loss)
For a condition on a tensor, use jnp.where or jax.lax.cond."""

# Loaders a step is given by mistake for one of their batches (by class name: cerebrax's
# DataLoader and DataExecutor live in a layer above this module, torch's in torch).
_LOADERS = ("DataLoader", "DataExecutor")

MSG_LOADER_PASSED = """\
The traced step `{name}` was given the {loader} itself, not one of its batches. A step
runs on one batch; the loader is iterated outside it.

Fix:
    for batch in dataloader:
        loss = {name}(batch)"""

MSG_RECOMPILE = """\
The traced step `{name}` was compiled for {what}, but this call passes {new}.
A traced step compiles once (the wafer runs one static graph), so every call must have
the same input shapes, dtypes and structure.
Fix: give every batch the same shape: pass drop_last=True to the torch DataLoader, or
pad the last batch. For debugging only, cstorch.backend("CPU", allow_recompile=True)
lets the step compile again."""

MSG_PYTHON_LIST = """.
A Python list or tuple is structure, not data: each item is a separate input, and a
Python number in it is a constant of the graph. Make the batch arrays instead, e.g.
np.asarray(inputs) or np.stack(list_of_samples)"""

MSG_HOOKS_CHANGED = """\
The traced step `{name}` was compiled with the gradient hooks its model's parameters
had then (p.register_hook), but hooks were registered or removed since. The hooks are
part of the graph, which compiles once: register every hook before the step is first
called, and remove none while it is used (or trace another step for the new hooks)."""

MSG_AUTOCAST_CHANGED = """\
The traced step `{name}` was compiled {then}, and is now called {now}. The casts of
torch.autocast are part of the graph, which compiles once: enter torch.autocast inside
the step (or call it always under the same autocast), or use one traced step for each."""

_READ_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
)

_MAX_RETRACES = 8


class Retrace(Exception):
    """Abandons the trace of a step so that its program is built again.

    Raised while a step is traced by code that must change the registered state first
    (a torch optimizer that the step steps is converted into a cerebrax one,
    :mod:`cerebrax.optim`): ``prepare()`` runs once the trace is abandoned, outside it,
    and the step is traced again from its start, so the Python before the raise runs
    once more.
    """

    def __init__(self, prepare: Callable[[], None], what: str):
        super().__init__(what)
        self.prepare = prepare


def before_build(hook: Callable[[], None]) -> None:
    """Calls ``hook()`` before every traced step's program is built (wiring that the
    step may need, such as cerebrax's torch optimizer hook, is installed there)."""
    if hook not in RUNTIME.build_hooks:
        RUNTIME.build_hooks.append(hook)


class TracedStep:
    """A step function compiled once into one ``jax.jit`` program. See :func:`trace`."""

    def __init__(self, fn: Callable[..., Any]):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._signature_of = inspect.signature(fn)
        self._reset_program()
        self.num_compiles = 0

    def _reset_program(self) -> None:
        self._jit = None
        self._key = None
        self._refs: list[_step.StateRef] = []
        self._diff_refs: list[_step.Parameter] = []
        self._backend = None
        self._out_skeleton: Skeleton | None = None  # what the step returns besides arrays
        self._closure_calls: list[_step.ClosureCall] = []
        self._modes: list[tuple[Any, bool]] = []
        self._hooks: tuple = ()  # the torch parameters' gradient hooks the program applies
        self._autocast: tuple = ()  # torch.autocast as the step was traced under it
        self._state_shardings: list | None = None
        self._input_shardings: list | None = None
        self._spans_processes = False  # the wafer mesh has devices of other processes
        self._budget_checked = False  # ClusterConfig.device_memory checked for this program

    # ---- input signature -------------------------------------------------------------
    def _split(self, args: tuple, kwargs: dict) -> tuple[tuple, list, Skeleton]:
        def array_of(leaf: Any) -> tuple[Any, Any] | None:
            # A torch tensor (or a streamed batch made from one) is a torch tensor of
            # this dtype again in a torch model's step; None: a JAX or numpy input.
            if is_torch_tensor(leaf):
                return torch_to_jax(leaf), leaf.dtype
            if is_array(leaf):
                return leaf, torch_origin(leaf)
            if type(leaf).__name__ in _LOADERS:
                raise ConfigError(MSG_LOADER_PASSED.format(
                    name=self.__name__, loader=type(leaf).__name__))
            return None

        dynamic, skeleton = partition((args, kwargs), array_of)
        # The program is keyed by the first three; the last (which inputs are torch
        # tensors, and their torch dtypes) is read when the program is built: a later
        # call that passes the same values as JAX arrays (or as torch tensors) runs the
        # same program.
        key = (
            skeleton.treedef,
            skeleton.leaves,
            tuple((x.shape, x.dtype) for x in dynamic),
            skeleton.torch_dtypes,
        )
        return key, dynamic, skeleton

    def _argument_name(self, path: tuple) -> str:
        """Names the argument a flattened leaf belongs to, e.g. ``inputs`` or ``batch[0]``."""
        (which, *rest) = path
        if which.idx == 0:  # positional
            index = rest[0].idx
            params = list(self._signature_of.parameters)
            name = params[index] if index < len(params) else f"args[{index}]"
            tail = rest[1:]
        else:
            name, tail = str(rest[0].key), rest[1:]
        return name + jax.tree_util.keystr(tuple(tail))

    def _recompile_error(self, args: tuple, kwargs: dict, new_key: tuple) -> RecompileError:
        old_def, old_statics, old_shapes, _ = self._key
        new_def, new_statics, new_shapes, _ = new_key
        name = self.__name__
        if old_def != new_def:  # name the first differing node, not the whole tree
            keys, old, new = _first_difference(old_def, new_def)
            arg = "the step's arguments"
            if len(keys) >= 2:
                params = list(self._signature_of.parameters)
                first = params[keys[1]] if keys[0] == 0 and keys[1] < len(params) else keys[1]
                arg = f"argument `{first}{''.join(f'[{k!r}]' for k in keys[2:])}`"
                if old.startswith(("a list", "a tuple")):
                    new += MSG_PYTHON_LIST
            return RecompileError(MSG_RECOMPILE.format(name=name, what=f"{arg} as {old}",
                                                       new=new))
        paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(
            (args, kwargs), is_leaf=is_torch_tensor)[0]]
        dyn_index = 0
        for path, old_static, new_static in zip(paths, old_statics, new_statics):
            arg = self._argument_name(path)
            if old_static is ARRAY and new_static is ARRAY:
                old = old_shapes[dyn_index]
                new = new_shapes[dyn_index]
                dyn_index += 1
                if old != new:
                    return RecompileError(MSG_RECOMPILE.format(
                        name=name,
                        what=f"argument `{arg}` with shape {old[0]} {old[1]}",
                        new=f"shape {new[0]} {new[1]}",
                    ))
            elif old_static is ARRAY or new_static is ARRAY:
                return RecompileError(MSG_RECOMPILE.format(
                    name=name, what=f"argument `{arg}` as {_input_kind(old_static)}",
                    new=_input_kind(new_static)))
            elif not _same_static(old_static, new_static):
                in_list = any(isinstance(k, jax.tree_util.SequenceKey) for k in path[2:])
                return RecompileError(MSG_RECOMPILE.format(
                    name=name,
                    what=f"argument `{arg}` = {old_static!r} (a Python value is part of "
                    "the graph)",
                    new=f"{new_static!r}; pass values that change as arrays"
                    + (MSG_PYTHON_LIST if in_list else ""),
                ))
        return RecompileError(MSG_RECOMPILE.format(name=name, what="other inputs", new="new ones"))

    # ---- building the program --------------------------------------------------------
    def _build(self, key: tuple, skeleton: Skeleton, backend: Backend) -> None:
        for hook in RUNTIME.build_hooks:
            hook()
        self._reset_program()
        self._key = key
        self._backend = backend
        self._refs = _step.live_refs()
        self._diff_refs = _step.optimized_parameters()
        as_torch = _torch_inputs(self._refs)

        def program(state_values: list, dynamic: list):
            args, kwargs = combine(dynamic, skeleton, torch=as_torch)
            ctx = TraceContext(self, self._refs, state_values, backend=backend,
                               differentiated=self._diff_refs,
                               aliases=_step.parameter_aliases())
            try:
                with _step.tracing(ctx):
                    out = ctx.run(self._fn, args, kwargs)
            except _READ_ERRORS as e:
                raise TensorReadError(
                    MSG_TENSOR_READ.format(name=self.__name__, detail=_first_line(e))
                ) from e
            record = ctx.finish(self._refs, out)
            self._modes = [(m, m.training) for m in record.models]
            self._hooks = _step.parameter_hooks()
            self._autocast = torch_autocast_state()
            new_values, out_arrays, closure_arrays = self._finish(record, state_values)
            if self._state_shardings is not None:
                new_values = jax.lax.with_sharding_constraint(new_values,
                                                              self._state_shardings)
            return new_values, out_arrays, closure_arrays

        layout = getattr(backend, "layout", None)
        if layout is None:
            self._jit = jax.jit(program, donate_argnums=(0,))
        else:
            # A multi-device CSX backend: state and inputs are laid out on the wafer mesh
            # (cerebrax.wse); XLA's SPMD partitioner inserts the collectives.
            self._state_shardings = [layout.state_shardings(ref.stored) for ref in self._refs]
            paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(
                jax.tree.unflatten(skeleton.treedef, [0] * len(skeleton.leaves)))[0]]
            names = [self._argument_name(p) for p, s in zip(paths, skeleton.leaves)
                     if s is ARRAY]
            self._input_shardings = [
                layout.input_sharding(jax.ShapeDtypeStruct(shape, dtype), name)
                for name, (shape, dtype) in zip(names, key[2])
            ]
            out_shardings = None
            self._spans_processes = not layout.replicated.is_fully_addressable
            if self._spans_processes:
                # The mesh spans processes: outputs and closure arguments come back
                # replicated, so every process reads them from its own devices.
                out_shardings = (self._state_shardings, layout.replicated, layout.replicated)
            self._jit = jax.jit(program, donate_argnums=(0,),
                                in_shardings=(self._state_shardings, self._input_shardings),
                                out_shardings=out_shardings)
        self.num_compiles += 1

    def _finish(self, record: StepRecord, old_values: list):
        new_values = [jax.tree.map(_match_dtype, new, old)
                      for new, old in zip(record.values, old_values)]
        # A torch tensor of the step leaves the program as a JAX array, and comes back to
        # the caller as a torch tensor of its dtype (see __call__).
        out_arrays, self._out_skeleton = partition(
            record.outputs, is_leaf=lambda x: isinstance(x, DeferredValue))
        self._closure_calls = list(record.closures)
        return new_values, out_arrays, list(record.closure_arrays)

    # ---- calling ---------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._retracing(self._call, args, kwargs)
        finally:
            _startup_gc.release()  # start-up ends with the first step

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """A traced method (``@cstorch.trace`` on ``def training_step(self, batch)``):
        looked up on an instance, the step bound to that instance, a traced step of its
        own (each instance compiles its own program, as ``self`` is part of the step's
        Python). It is kept in the instance's ``__dict__``, so later lookups find it."""
        if instance is None:
            return self
        bound = TracedStep(types.MethodType(self._fn, instance))
        try:
            vars(instance)[self.__name__] = bound
        except TypeError:
            raise ConfigError(
                f"@cstorch.trace on the method `{self.__name__}` of "
                f"{type(instance).__name__}, whose instances have no __dict__ (__slots__): "
                "the traced step bound to an instance is kept there. Trace a function "
                "instead, or give the class a __dict__.") from None
        return bound

    def _retracing(self, run: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``run(*args, **kwargs)``, built and traced again after each :class:`Retrace`."""
        for _ in range(_MAX_RETRACES):
            built = self.num_compiles
            try:
                return run(*args, **kwargs)
            except Retrace as request:
                self._jit, self.num_compiles = None, built  # that program never ran
                request.prepare()
        raise StateError(
            f"The traced step `{self.__name__}` was traced {_MAX_RETRACES} times without "
            "settling its state; each trace converted another torch optimizer or scheduler."
        )

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        if _step.active_context() is not None:
            raise StateError(
                f"The traced step `{self.__name__}` was called inside another traced "
                "step. Call the inner function directly; only the outer one is traced."
            )
        backend = get_or_create_backend(None)
        key, dynamic, skeleton = self._split(args, kwargs)
        if self._jit is None or backend is not self._backend:
            self._build(key, skeleton, backend)
        elif key[:3] != self._key[:3]:
            if not backend.allow_recompile:
                raise self._recompile_error(args, kwargs, key)
            self._build(key, skeleton, backend)
        else:
            self._check_modes()
        if backend.is_e2e_execution and not self._budget_checked:
            self._check_memory_budget(backend, dynamic)
        states, dynamic = self._placed(dynamic)
        if not backend.is_e2e_execution:
            return self._compile_or_validate(backend, states, dynamic)
        new_states, out_arrays, closure_arrays = self._jit(states, dynamic)
        for ref, value in zip(self._refs, new_states):
            ref.store(value)
        out = combine(out_arrays, self._out_skeleton, torch=_torch_tensor)
        _step.after_dispatch(self._closure_calls, closure_arrays, out_arrays, out,
                                 self.__name__)
        return out

    def _check_modes(self) -> None:
        if self._hooks != _step.parameter_hooks():
            raise RecompileError(MSG_HOOKS_CHANGED.format(name=self.__name__))
        if self._autocast != torch_autocast_state():
            raise RecompileError(MSG_AUTOCAST_CHANGED.format(
                name=self.__name__, then=_describe_autocast(self._autocast),
                now=_describe_autocast(torch_autocast_state())))
        for model, mode in self._modes:
            if model.training != mode:
                raise RecompileError(
                    f"The traced step `{self.__name__}` was compiled with the model in "
                    f"{'train' if mode else 'eval'} mode, but the model is now in "
                    f"{'train' if model.training else 'eval'} mode. The mode is part of "
                    "the graph: use one traced step for training and another for "
                    "evaluation, and call model.train() / model.eval() before each."
                )

    def _compile_or_validate(self, backend, states: list, dynamic: list) -> Any:
        if backend.validate_only:
            shapes = jax.eval_shape(self._jit, states, dynamic)
            print(f"[cerebrax] validated `{self.__name__}`: traced, nothing compiled or run.")
        else:
            start = time.perf_counter()
            lowered = self._jit.lower(states, dynamic)
            compiled = lowered.compile()
            shapes = jax.eval_shape(self._jit, states, dynamic)
            write_artifacts(backend.compile_dir, self.__name__, lowered, compiled,
                            time.perf_counter() - start)
            report = wse.report_for_compiled(self, compiled)
            path = os.path.join(backend.compile_dir, f"{self.__name__}.memory.txt")
            with open(path, "a") as f:
                f.write(report.format() + "\n")
            budget = _device_memory(backend)
            if budget is not None:
                wse.check_memory_budget(report, budget, self.__name__)
        _, out_shapes, _ = shapes
        return combine(out_shapes, self._out_skeleton)

    def _check_memory_budget(self, backend: Backend, dynamic: list) -> None:
        """With ``ClusterConfig(device_memory=...)``: compiles the step ahead of time and
        raises ``ConfigError`` before anything is placed or run when one device's largest
        live set exceeds the budget (the compiled program is cached for the run)."""
        budget = _device_memory(backend)
        if budget is not None:
            states = [ref.stored for ref in self._refs]
            if self._state_shardings is not None:
                states = jax.tree.map(
                    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                    states, self._state_shardings)
                dynamic = [jax.ShapeDtypeStruct(shape, dtype, sharding=s)
                           for (shape, dtype), s in zip(self._key[2], self._input_shardings)]
            compiled = self._jit.lower(states, dynamic).compile()
            wse.check_memory_budget(wse.report_for_compiled(self, compiled), budget,
                                    self.__name__)
        self._budget_checked = True

    @property
    def backend(self) -> Backend | None:
        """The backend the step's program was last built for (None before a build)."""
        return self._backend

    def state_layout(self) -> list[tuple[_step.StateRef, Any]]:
        """Each state slot of the built program with its shardings: the wafer layout's
        where the backend has one, else each array's own placement."""
        if self._state_shardings is not None:
            return list(zip(self._refs, self._state_shardings))
        return [(ref, jax.tree.map(lambda x: getattr(x, "sharding", None), ref.stored))
                for ref in self._refs]

    def lower(self, *args: Any, **kwargs: Any):
        """Lowers the step for these inputs (``jax.stages.Lowered``), running nothing."""
        return self._retracing(self._lower, args, kwargs)

    def _lower(self, *args: Any, **kwargs: Any):
        backend = get_or_create_backend(None)
        key, dynamic, skeleton = self._split(args, kwargs)
        if self._jit is None or key[:3] != self._key[:3]:
            self._build(key, skeleton, backend)
        return self._jit.lower(*self._placed(dynamic))

    def _placed(self, dynamic: list) -> tuple[list, list]:
        """The state values and inputs, moved to the wafer layout's shardings if any."""
        states = [ref.stored for ref in self._refs]
        if self._state_shardings is None:
            return states, dynamic
        # Values already in their layout (the state after a step, batches that the data
        # stream placed) stay; on a mesh that spans processes each process copies only
        # the slices its devices hold (cerebrax._placement).
        states = put_many(states, self._state_shardings)
        for ref, value in zip(self._refs, states):
            ref.store(value)
        return states, put_many(dynamic, self._input_shardings)


def write_artifacts(directory: str, name: str, lowered: Any, compiled: Any, seconds: float,
                    *, what: str | None = None) -> None:
    """Writes a compiled step's HLO text and XLA memory analysis under ``directory``.

    ``{name}.hlo.txt`` holds the lowered program, ``{name}.memory.txt`` the compile
    time and XLA's argument, output, temporary, alias and code sizes in bytes, then the
    ``cstorch.backends.csx`` flags and ClusterConfig appliance fields set, each marked
    applied or recorded (:func:`cerebrax.backend.flags_report`).
    ``what`` names the step in the printed line (default: the name in backquotes).
    """
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{name}.hlo.txt"), "w") as f:
        f.write(lowered.as_text())
    memory = compiled.memory_analysis()
    lines = [f"step: {name}", f"compile_seconds: {seconds:.3f}"]
    if memory is not None:
        for field in ("argument_size_in_bytes", "output_size_in_bytes",
                      "temp_size_in_bytes", "alias_size_in_bytes",
                      "generated_code_size_in_bytes"):
            lines.append(f"{field}: {getattr(memory, field, 'n/a')}")
    lines += flags_report(current_backend(raise_exception=False))
    with open(os.path.join(directory, f"{name}.memory.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    what = what or f"`{name}`"
    print(f"[cerebrax] compiled {what} in {seconds:.2f} s; artifacts in {directory}")


def _device_memory(backend: Any) -> int | None:
    """The backend's per-device memory budget in bytes (ClusterConfig.device_memory)."""
    return getattr(getattr(backend, "cluster_config", None), "device_memory", None)


def _torch_inputs(refs: list) -> Callable[[Any, Any], Any] | None:
    """How the step sees its array inputs: torch tensors stay torch tensors.

    In a torch-native step (a compiled model is a torch module) every input that came
    in as a torch tensor, directly or streamed by a cstorch DataLoader, is a
    ``torch_bridge.JaxTensor`` (a torch tensor that holds the program's value) of the
    dtype it came in with. numpy and JAX inputs stay JAX arrays, and so do the outputs
    of a model called on them. A step of JAX models computes with JAX arrays, whatever
    the inputs were (None: no input is made a tensor).
    """
    models = {id(r.owner): r.owner for r in refs if getattr(r, "owner", None) is not None}
    if not any(getattr(m, "is_torch", False) for m in models.values()):
        return None
    return _torch_tensor


def _match_dtype(new: Any, old: Any) -> Any:
    """Casts a new state leaf to its old dtype, strongly typed (a stable signature)."""
    if jax.dtypes.issubdtype(old.dtype, jax.dtypes.prng_key):
        return new
    return jax.lax.convert_element_type(new, old.dtype)


def _first_difference(old: Any, new: Any, keys: tuple = ()) -> tuple[tuple, str, str]:
    """``(keys, old, new)``: where two input structures (PyTreeDefs) first differ."""
    if old.node_data() == new.node_data() and len(old.children()) == len(new.children()):
        data = old.node_data()
        names = data[1] if data is not None and data[0] is dict else range(len(old.children()))
        for key, a, b in zip(names, old.children(), new.children()):
            if a != b:
                return _first_difference(a, b, (*keys, key))
    return keys, _describe(old), _describe(new)


def _describe(treedef: Any) -> str:
    """A short description of a pytree node, e.g. ``a list of 64 items``."""
    data = treedef.node_data()
    if data is None:
        return "one leaf (an array or a Python value)"
    kind, aux = data
    if kind in (list, tuple):
        n = len(treedef.children())
        return f"a {kind.__name__} of {n} item{'' if n == 1 else 's'}"
    if kind is dict:
        return f"a dict with keys {list(aux)}"
    return "None" if kind is type(None) else f"a {kind.__name__}"


def _same_static(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # objects whose == is not a plain bool
        return a is b


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"(JAX said: {text[0]})" if text else ""


def trace(fn: Callable[..., Any]) -> TracedStep:
    """Compiles a whole training or evaluation step into one static graph.

    The step runs its Python once, at the first call, and becomes one ``jax.jit``
    program over all registered state: forward, backward and optimizer update fused.
    Later calls run the compiled program; Python side effects in the step (a counter,
    a print of a non-tensor) happen only at that first call. Calling the step with
    inputs of another shape, dtype or structure raises :class:`RecompileError`;
    reading a tensor's value inside raises :class:`TensorReadError`.

    Example:
      >>> @cstorch.trace
      ... def training_step(inputs, targets):
      ...     loss = loss_fn(compiled_model(inputs), targets)
      ...     cstorch.backward(loss)
      ...     optimizer.step()
      ...     optimizer.zero_grad()
      ...     return loss
    """
    return TracedStep(fn)


compile_step = trace


def _input_kind(leaf: Any) -> str:
    """A step input as a recompile error names it."""
    return "an array" if leaf is ARRAY else f"the Python value {leaf!r}"


def _torch_tensor(array: Any, dtype: Any) -> Any:
    """A torch tensor of ``dtype`` over ``array`` (``torch_bridge.JaxTensor``: no host
    transfer): an input or output that was a torch tensor is one again."""
    from torch_bridge import JaxTensor

    return JaxTensor(array, dtype)


def _describe_autocast(state: tuple) -> str:
    return f"under torch.autocast({state[0]!r}, dtype={state[1]})" if state else (
        "without torch.autocast")
