"""``torch.export`` to core ATen, with the ops the bridge lowers whole kept whole."""

from __future__ import annotations

import contextlib
import operator
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch._decomp
from torch._C import DispatchKey
from torch._subclasses.fake_tensor import FakeTensor

from ._rewrites import rewrite
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


@contextlib.contextmanager
def _mode(module: torch.nn.Module, train: bool) -> Iterator[None]:
    """Puts every submodule in ``train`` mode, then restores each one's own mode."""
    before = [(m, m.training) for m in module.modules()]
    module.train(train)
    try:
        yield
    finally:
        for m, was in before:
            m.training = was


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


def _decompositions() -> Any:
    table = torch.export.default_decompositions()
    for op in KEPT_WHOLE:
        table.pop(op, None)
    return table


# ---- gradient stops ------------------------------------------------------------------
# Decomposition produces an inference graph: `x.detach()` becomes an alias and a
# `torch.no_grad()` block is inlined, so jax.grad would differentiate through both.
# Before decomposing, both are marked with `torch.ops.torch_bridge.stop_gradient`
# (defined with its lowering in `ops`), which survives decomposition.
def _is_no_grad_block(node: torch.fx.Node) -> bool:
    return (node.op == "call_function"
            and node.target is torch.ops.higher_order.wrap_with_set_grad_enabled
            and node.args and node.args[0] is False)


def _mark_gradient_stops(program: torch.export.ExportedProgram) -> None:
    graph = program.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.detach.default:
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
) -> torch.export.ExportedProgram:
    """Exports ``module`` in train or eval mode and decomposes it to core ATen."""
    with _mode(module, train), _fast_recurrent_shapes(), warnings.catch_warnings():
        for category, message in _TORCH_INTERNAL_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        program = torch.export.export(module, args, kwargs)
        _mark_gradient_stops(program)
        return rewrite(program.run_decompositions(_decompositions()))
