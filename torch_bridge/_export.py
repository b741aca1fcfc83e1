"""``torch.export`` to core ATen, with the ops the bridge lowers whole kept whole."""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import logging
import operator
import os
import re
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch._decomp
import torch._export.utils as _export_utils
from torch._C import DispatchKey
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from cerebrax.errors import ConfigError, TensorReadError

from ._autograd import exporting_functions
from ._direct import training_mode
from ._hooks import link_tensor_hooks
from ._rewrites import rewrite
from ._side_calls import SideCalls, exporting_side_calls
from .ops import _custom  # noqa: F401  (defines torch.ops.torch_bridge.stop_gradient)

__all__ = ["KEPT_WHOLE", "export_program"]

aten = torch.ops.aten

# Ops that core decomposition would break up but that lower better whole: recurrent
# layers become one `lax.scan` instead of one graph node per time step (an LSTM over 200
# steps decomposes into ~8,400 nodes and a first jit of ~18 s), attention stays one
# fused expression.
KEPT_WHOLE = (
    aten.lstm.input,
    aten.gru.input,
    aten.rnn_tanh.input,
    aten.rnn_relu.input,
    aten.scaled_dot_product_attention.default,
)

# Warnings torch.export emits from its own internals, which a user cannot act on.
_TORCH_INTERNAL_WARNINGS = (
    # run_decompositions deep-copies the module call graph (torch 2.13 pytree internals).
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
    # nn.RNNBase re-assigns its `_flat_weights` list inside forward.
    (UserWarning, r"The tensor attributes .*_flat_weights\[\d+\].* were assigned during export"),
)


# torch computes the output shapes of a recurrent op during export by running its Python
# decomposition on fake tensors, one cell per time step: ~2 s per export for 200 steps.
# The shapes follow from the arguments directly; this kernel gives them, for fake
# tensors only, while the bridge exports (real tensors still take torch's own kernel).
_RECURRENT = (aten.lstm.input, aten.gru.input, aten.rnn_tanh.input, aten.rnn_relu.input)
_SHAPE_KEYS = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd)


def _shape_only(op: Any) -> Any:
    original = op.py_kernels[DispatchKey.CompositeImplicitAutograd]

    def kernel(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
               batch_first):
        if not isinstance(input, FakeTensor):
            return original(input, hx, params, has_biases, num_layers, dropout, train,
                            bidirectional, batch_first)
        states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        shape = list(input.shape)
        shape[-1] = (2 if bidirectional else 1) * states[0].shape[-1]
        return (input.new_empty(shape), *(s.new_empty(s.shape) for s in states))

    return kernel


@contextlib.contextmanager
def _fast_recurrent_shapes() -> Iterator[None]:
    # Fake tensors reach the decomposition through either the op's Python kernels or
    # torch._decomp's table; both point at the shape-only kernel while exporting.
    table = torch._decomp.decomposition_table
    saved = []
    try:
        for op in _RECURRENT:
            if not all(k in op.py_kernels for k in _SHAPE_KEYS):
                continue
            saved.append((op, {k: op.py_kernels[k] for k in _SHAPE_KEYS}, table.get(op)))
            kernel = _shape_only(op)
            for k in _SHAPE_KEYS:
                op.py_kernels[k] = kernel
            if op in table:
                table[op] = kernel
            op._dispatch_cache.clear()
        yield
    finally:
        for op, kernels, decomposition in saved:
            op.py_kernels.update(kernels)
            if decomposition is not None:
                table[op] = decomposition
            op._dispatch_cache.clear()


# ---- the decomposition table ----------------------------------------------------------
# torch builds its core ATen table afresh for every run_decompositions call: it walks
# every CompositeImplicitAutograd op of every loaded op namespace, about 0.3 s with
# torchvision's ops loaded, and again to split the table. The table depends only on the
# ops registered with a CompositeImplicitAutograd kernel, so it is built once per set of
# registrations (a custom op registered later is another set, and a new table).
def _cia_registrations() -> tuple[str, ...]:
    return tuple(torch._C._dispatch_get_registrations_for_dispatch_key(
        "CompositeImplicitAutograd"))


@functools.lru_cache(maxsize=1)
def _table_for(registrations: tuple[str, ...]) -> dict[Any, Any]:
    del registrations  # the cache key
    table = torch.export.default_decompositions()
    for op in KEPT_WHOLE:
        table.pop(op, None)
    return dict(table.items())


def _decompositions() -> dict[Any, Any]:
    """torch's core ATen table less ``KEPT_WHOLE``, a plain dict that
    ``run_decompositions`` takes as it is (it copies it before changing it)."""
    return dict(_table_for(_cia_registrations()))


@functools.lru_cache(maxsize=1)
def _materialized(registrations: tuple[str, ...]) -> None:
    del registrations  # the cache key
    _MATERIALIZE_CIA_OPS()


def _materialize_once() -> None:
    """``torch._export.utils._materialize_cpp_cia_ops``, which looks up every registered
    CompositeImplicitAutograd op in ``torch.ops`` so that the lookups create them. torch
    calls it once per op namespace and per table split, about 60 times per
    ``run_decompositions`` with torchvision loaded (0.2 s); after the first, a call with
    the same registrations has nothing left to create."""
    _materialized(_cia_registrations())


_MATERIALIZE_CIA_OPS = getattr(_export_utils, "_materialize_cpp_cia_ops", None)


@contextlib.contextmanager
def _fast_decomposition() -> Iterator[None]:
    """While the bridge decomposes, torch's op lookup runs once per set of registrations
    (``_materialize_once``); a torch without that function is left as it is."""
    if _MATERIALIZE_CIA_OPS is None:
        yield
        return
    _export_utils._materialize_cpp_cia_ops = _materialize_once
    try:
        yield
    finally:
        _export_utils._materialize_cpp_cia_ops = _MATERIALIZE_CIA_OPS


# ---- gradient stops ------------------------------------------------------------------
# Decomposition produces an inference graph: `x.detach()` becomes an alias and a
# `torch.no_grad()` block is inlined, so jax.grad would differentiate through both.
# Before decomposing, both are marked with `torch.ops.torch_bridge.stop_gradient`
# (defined with its lowering in `ops`), which survives decomposition.
def _is_no_grad_block(node: torch.fx.Node) -> bool:
    return (node.op == "call_function"
            and node.target is torch.ops.higher_order.wrap_with_set_grad_enabled
            and node.args and node.args[0] is False)


def _written_in_place(node: torch.fx.Node) -> bool:
    """Whether an in-place op writes through ``node`` (``x.detach().renorm_()``: the write
    must reach ``x``, which a stop-gradient copy would lose)."""
    for user in node.users:
        schema = getattr(user.target, "_schema", None)
        if schema is None:
            continue
        for arg, value in zip(schema.arguments, user.args):
            if value is node and arg.alias_info is not None and arg.alias_info.is_write:
                return True
    return False


def _mark_gradient_stops(program: torch.export.ExportedProgram) -> None:
    graph = program.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if (node.op == "call_function" and node.target is aten.detach.default
                and not _written_in_place(node)):
            node.target = torch.ops.torch_bridge.stop_gradient.default
            changed = True
        elif _is_no_grad_block(node):
            for user in list(node.users):
                if user.target is not operator.getitem:
                    continue
                with graph.inserting_after(user):
                    stop = graph.call_function(torch.ops.torch_bridge.stop_gradient.default,
                                               (user,))
                stop.meta = dict(user.meta)
                user.replace_all_uses_with(stop, delete_user_cb=lambda n: n is not stop)
                changed = True
    if changed:
        program.graph_module.recompile()


def export_program(
    module: torch.nn.Module, args: tuple, kwargs: dict, *, train: bool
) -> tuple[torch.export.ExportedProgram, SideCalls]:
    """Exports ``module`` in train or eval mode and decomposes it to core ATen; also
    returns the calls its ``forward`` made for their effect (see ``_side_calls``).

    Custom autograd Functions and gradient hooks in ``forward`` become nodes of the
    graph that run them on the gradients (``torch_bridge._autograd``)."""
    with training_mode(module, train), _fast_recurrent_shapes(), warnings.catch_warnings():
        for category, message in _TORCH_INTERNAL_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        with exporting_side_calls(module) as side_calls, exporting_functions():
            program = _export(module, args, kwargs)
        _mark_gradient_stops(program)
        with _fast_decomposition():
            program = program.run_decompositions(_decompositions())
        program = rewrite(program)
        link_tensor_hooks(program)
        return program, side_calls[0]


# ---- export errors -------------------------------------------------------------------
MSG_DATA_DEPENDENT = """\
{module}'s forward branches on a tensor's value, which a compiled graph cannot do: the
graph is captured once and runs the same ops for every value.
{where}{hint}Fix: compute both branches and select with torch.where(cond, a, b), or make the
decision outside forward (a Python flag argument is a constant of the graph)."""

MSG_DATA_OUTPUT = """\
{module}'s forward calls {op} (itself, or inside a torch function), whose result is a
Python value computed from a tensor's values, which a compiled graph cannot hold: the
graph is captured once and runs the same ops for every value.
{where}Fix: keep the result a tensor (torch.all(a == b) for torch.equal) and select with
torch.where(cond, a, b), or compute it outside forward."""

MSG_OUTPUT_TYPE = """\
{module} returns a {kind}, which a compiled graph cannot return (only tensors and
containers of tensors: tuples, lists, dicts, transformers ModelOutputs).
{hint}Fix: return tensors only."""

# Call flags that keep a model's forward free of what a static graph cannot hold, and
# the value to pass: a transformers decoder with use_cache=True builds and returns a
# key/value cache object.
_STATIC_FLAGS = {"use_cache": False}


def _export(module: torch.nn.Module, args: tuple, kwargs: dict
            ) -> torch.export.ExportedProgram:
    """``torch.export.export``, its failures on data-dependent code as short errors.

    torch prints the partial graph of a failed export to stderr and logs a warning per
    unnamed symbol; both are dropped here, the error names the source line instead.
    """
    with _quiet_export() as failed:
        try:
            return torch.export.export(module, args, kwargs)
        except GuardOnDataDependentSymNode as e:
            failed.append(e)
            raise TensorReadError(MSG_DATA_DEPENDENT.format(
                module=_name(module), where=_where(e), hint=_hint(module, kwargs))
            ) from None
        except DataDependentOutputException as e:  # torch.equal, or an op calling it
            failed.append(e)
            raise TensorReadError(MSG_DATA_OUTPUT.format(
                module=_name(module), op=str(e.func), where=_where(e, "The call is at"))
            ) from None
        except RuntimeError as e:
            found = re.match(r"Found <class '([\w.]+)'> in output, which is not a known "
                             r"type", str(e))
            if found is None:
                raise
            raise ConfigError(MSG_OUTPUT_TYPE.format(
                module=_name(module), kind=found.group(1), hint=_hint(module, kwargs))
            ) from None


class _DropLogs(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextlib.contextmanager
def _quiet_export() -> Iterator[list]:
    """Holds back what torch writes to stderr during an export, and drops its symbolic
    shape warnings; afterwards writes the rest, less the graph of a failed export (the
    block appends the export's error to the list it gets)."""
    stderr, quiet, failed = io.StringIO(), _DropLogs(), []
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    logger.addFilter(quiet)
    try:
        with contextlib.redirect_stderr(stderr):
            yield failed
    finally:
        logger.removeFilter(quiet)
        text = stderr.getvalue()
        for error in failed:
            graph = getattr(error, "partial_fx_graph", None)
            if graph is not None:
                text = text.replace(str(graph), "")
        if text.strip():
            sys.stderr.write(text)


def _name(module: torch.nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


_BRIDGE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # this package's frames


def _where(error: BaseException, label: str = "The branch is at") -> str:
    """The source line torch reports for ``error`` (its user frame), after ``label``."""
    found = re.search(r"The following call raised this error:\n(.*?)\n\n", str(error),
                      re.DOTALL)
    if found:
        return f"{label}\n" + found.group(1).rstrip() + "\n"
    for frame in reversed(inspect.getinnerframes(error.__traceback__, context=1)):
        if "/torch/" not in frame.filename and not frame.filename.startswith(_BRIDGE):
            code = (frame.code_context or [""])[0].strip()
            return (f"{label}\n  File \"{frame.filename}\", line {frame.lineno}, "
                    f"in {frame.function}\n    {code}\n")
    return ""


def _hint(module: torch.nn.Module, kwargs: dict) -> str:
    """The flags of :data:`_STATIC_FLAGS` the module takes and the call sets otherwise."""
    try:
        accepted = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return ""
    wrong = {}
    for flag, good in _STATIC_FLAGS.items():
        if flag in accepted:
            value = kwargs.get(flag, accepted[flag].default)
            if value is not inspect.Parameter.empty and value != good:
                wrong[flag] = (value, good)
    if not wrong:
        return ""
    passed = ", ".join(f"{k}={v!r}" for k, (v, _) in wrong.items())
    fix = ", ".join(f"{k}={g!r}" for k, (_, g) in wrong.items())
    return f"The call runs it with {passed}; pass {fix} to avoid this.\n"
