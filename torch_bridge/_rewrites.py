"""Rewrites of the exported ATen graph that the lowerings cannot make one node at a time.

``fold_broadcast_matmuls``: torch decomposes ``x @ w`` for an ``x`` with several leading
dims that do not flatten into one without a copy (a transposed activation) into a
batched product against ``w`` copied once per batch element::

    bmm(view(expand(x)), view(expand(w.t(), [B, k, n]), [B, k, n]))

``nn.MultiheadAttention(batch_first=True)`` projects its inputs this way (its ``linear``
sees the activations as ``(seq, batch, d)``), and so do ``nn.TransformerEncoderLayer``,
``nn.TransformerDecoderLayer`` and ``nn.Transformer`` with ``batch_first=True``. Lowered
as written, XLA materializes the expanded weight (``seq * d * 3d`` floats: 1.3 GiB per
layer for ViT-B/16 at 224x224) and, under ``jax.grad``, a per-batch weight gradient of
the same size before summing it. The rewrite replaces such a ``bmm`` by
``matmul(x, w.t())``, which lowers to one ``dot_general`` without the broadcast dim:
the same products and sums, so the result is exact.

``split_partitions``: a tensor cut into pieces along one dim by one ``select`` or
``slice`` per piece (``nn.MultiheadAttention`` takes q, k, v from its packed projection
with three ``select``; ``qkv.unbind(0)`` decomposes into a ``slice`` and a ``squeeze``
per piece). Lowered one piece at a time, the derivative pads each piece's cotangent to
the whole tensor's shape and adds the pads; the rewrite takes the pieces from one
``split_with_sizes``, whose derivative is one concatenate.
"""

from __future__ import annotations

import math
import operator

import torch

__all__ = ["fold_broadcast_matmuls", "rewrite", "split_partitions"]

aten = torch.ops.aten

# Ops that pass a tensor on with its trailing (rows, cols) block intact when their output
# keeps the same trailing two dims (checked per node).
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
             aten.clone.default, aten.alias.default)


def _shape(node: object) -> tuple[int, ...] | None:
    """The static shape of a graph node's tensor, or None (not a tensor, or symbolic)."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    shape = tuple(val.shape)
    return shape if all(isinstance(d, int) for d in shape) else None


def _is_call(node: object, targets: tuple) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and node.target in targets)


def _broadcast_source(operand: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor that ``operand`` (a ``bmm`` operand, ``(B, r, c)``) repeats over its
    batch dim, or None.

    ``operand`` qualifies when it is ``expand(src)`` followed by reshapes that keep the
    trailing ``(r, c)`` block, and ``src`` is ``(r, c)`` with at most size-1 dims in
    front: every batch element of ``operand`` is then ``src`` itself.
    """
    block = (_shape(operand) or ())[-2:]
    if len(block) != 2:
        return None
    node = operand
    while _is_call(node, _RESHAPES):
        if (_shape(node) or ())[-2:] != block:
            return None
        node = node.args[0]
    if not _is_call(node, (aten.expand.default,)) or (_shape(node) or ())[-2:] != block:
        return None
    source = node.args[0]
    shape = _shape(source)
    if shape is None or len(shape) < 2 or shape[-2:] != block or math.prod(shape[:-2]) != 1:
        return None
    return source


def _as_matrix(graph: torch.fx.Graph, source: torch.fx.Node,
               like: torch.fx.Node) -> torch.fx.Node:
    """``source`` as a 2-d tensor (a view dropping its leading size-1 dims if it has any);
    a new node takes ``like``'s metadata (module path) with its own value."""
    shape = _shape(source)
    if len(shape) == 2:
        return source
    with graph.inserting_before(like):
        view = graph.call_function(aten.view.default, (source, list(shape[-2:])))
    view.meta = {**like.meta, "val": source.meta["val"].reshape(shape[-2:])}
    return view


def _erase_unused(graph: torch.fx.Graph, node: object) -> None:
    """Erases ``node`` and the expand/reshape chain feeding it, while nothing uses them."""
    while (_is_call(node, (*_RESHAPES, aten.expand.default)) and not node.users):
        source = node.args[0]
        graph.erase_node(node)
        node = source


def fold_broadcast_matmuls(graph: torch.fx.Graph) -> bool:
    """Replaces, in place, every ``bmm`` whose one operand is a 2-d tensor expanded over
    the batch dim by ``matmul`` against that 2-d tensor. Returns whether the graph
    changed.

    A ``bmm`` with both operands broadcast is left alone (its result is a broadcast too,
    and torch does not emit one for a matmul).
    """
    changed = False
    for node in list(graph.nodes):
        if not _is_call(node, (aten.bmm.default,)):
            continue
        a, b = node.args
        a_src, b_src = _broadcast_source(a), _broadcast_source(b)
        if (a_src is None) == (b_src is None):
            continue
        if a_src is not None:
            node.args = (_as_matrix(graph, a_src, node), b)
            _erase_unused(graph, a)
        else:
            node.args = (a, _as_matrix(graph, b_src, node))
            _erase_unused(graph, b)
        node.target = aten.matmul.default
        changed = True
    return changed


def _piece(node: torch.fx.Node, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """``(dim, start, stop)`` of the piece of a ``shape`` tensor that ``node`` takes when it
    is a ``select`` or a step-1 ``slice`` of it; else None."""
    if node.kwargs or not _is_call(node, (aten.select.int, aten.slice.Tensor)):
        return None
    if node.target is aten.select.int:
        _, dim, index = node.args
        start, stop, step = index, None, 1
    else:
        _, dim, start, stop, step = (*node.args, *(None, 0, None, None, 1)[len(node.args):])
    n = _size(shape, dim)
    if n is None or step != 1 or not all(isinstance(b, int | None) for b in (start, stop)):
        return None
    if node.target is aten.select.int:
        start %= n
        stop = start + 1
    lo, hi, _ = slice(start, stop).indices(n)
    return dim % len(shape), lo, max(lo, hi)


def _size(shape: tuple[int, ...], dim: object) -> int | None:
    inside = isinstance(dim, int) and -len(shape) <= dim < len(shape)
    return shape[dim] if inside else None


def _partition(source: torch.fx.Node) -> tuple[int, list[torch.fx.Node]] | None:
    """The dim and the users of ``source`` (ordered by position) when those users are
    ``select``/``slice`` nodes that together cut that dim into disjoint pieces covering
    it, at least two of them; else None."""
    shape = _shape(source)
    if not shape:
        return None
    pieces = {}
    for user in source.users:
        if user.args and user.args[0] is source and (p := _piece(user, shape)):
            pieces[user] = p
    if len(pieces) < 2 or len({dim for dim, _, _ in pieces.values()}) != 1:
        return None
    order = sorted(pieces, key=lambda u: pieces[u][1:])
    dim = pieces[order[0]][0]
    edge = 0
    for user in order:
        _, lo, hi = pieces[user]
        if lo != edge:
            return None
        edge = hi
    return (dim, order) if edge == shape[dim] else None


def split_partitions(graph: torch.fx.Graph) -> bool:
    """Replaces every set of ``select``/``slice`` users that partition a tensor along one
    dim by the outputs of one ``split_with_sizes`` (a ``select``'s piece then loses its
    dim with a ``squeeze``). Returns whether the graph changed."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    changed = False
    for source in list(graph.nodes):
        found = _partition(source)
        if found is None:
            continue
        dim, order = found
        sizes = [_shape(u)[dim] if u.target is aten.slice.Tensor else 1 for u in order]
        first = min(order, key=position.__getitem__)  # the split joins the first use's layer
        with graph.inserting_before(first):
            split = graph.call_function(aten.split_with_sizes.default, (source, sizes, dim))
        split.meta = {**first.meta,
                      "val": list(source.meta["val"].split_with_sizes(sizes, dim))}
        for i, user in enumerate(order):
            with graph.inserting_before(user):
                piece = graph.call_function(operator.getitem, (split, i))
            piece.meta = {**user.meta, "val": split.meta["val"][i]}
            if user.target is aten.select.int:
                user.target, user.args = aten.squeeze.dims, (piece, [dim])
            else:
                user.replace_all_uses_with(piece)
                graph.erase_node(user)
        changed = True
    return changed


def rewrite(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Applies every rewrite of this module to ``program``, in place. Returns it."""
    graph = program.graph_module.graph
    changed = fold_broadcast_matmuls(graph)
    changed = split_partitions(graph) or changed
    if changed:
        graph.lint()
        program.graph_module.recompile()
    return program
