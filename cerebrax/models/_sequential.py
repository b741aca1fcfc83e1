"""Sequential layers of functional and flax ``nnx`` models, for pipeline mode.

A sequential model is a list of layers where the first layer receives the model's
inputs and every later layer receives the previous layer's output. Each layer is a
:class:`LayerFn`: a pure call on the named parameters and buffers it owns.
:func:`sequential_layers` turns the list into the :class:`~cerebrax.wse.Layers` that
pipeline mode splits into stages; :func:`run_sequential` runs the whole list (the
single-device path), so both paths run the same code per layer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import jax

from ..wse import Layers, Stage

__all__ = ["LayerCall", "LayerFn", "run_sequential", "sequential_layers", "state_shapes",
           "tree_size"]

# call(params, buffers, args, kwargs, train, key) -> (output, buffer updates)
LayerCall = Callable[[dict, dict, tuple, dict, bool, Any], tuple[Any, dict]]

@dataclasses.dataclass(frozen=True)
class LayerFn:
    """One layer: its name, its state names, a balancing cost and a pure call.

    ``signature`` is the layer's structural key (see ``wse.Layers.signature``), or None.
    """

    name: str
    params: tuple[str, ...]
    buffers: tuple[str, ...]
    cost: int
    call: LayerCall
    needs_key: bool = False
    signature: Hashable | None = None


def _layer_key(key: Any, index: int) -> Any:
    return None if key is None else jax.random.fold_in(key, index)


def _run(layers: Sequence[LayerFn], lo: int, hi: int, params: Mapping, buffers: Mapping,
         carry: Any, args: tuple, kwargs: dict, train: bool, key: Any) -> tuple[Any, dict]:
    updates: dict = {}
    for i in range(lo, hi):
        layer = layers[i]
        a, kw = (args, kwargs) if i == 0 else ((carry,), {})
        p = {n: params[n] for n in layer.params}
        b = {n: updates.get(n, buffers[n]) for n in layer.buffers}
        carry, new = layer.call(p, b, a, kw, train, _layer_key(key, i))
        updates.update(new)
    return carry, updates


def run_sequential(layers: Sequence[LayerFn], params: Mapping, buffers: Mapping,
                   args: tuple, kwargs: dict, *, train: bool, key: Any) -> tuple[Any, dict]:
    """Runs every layer in order; returns ``(outputs, buffers after the call)``."""
    out, updates = _run(layers, 0, len(layers), params, buffers, None, args, kwargs,
                        train, key)
    return out, {**buffers, **updates}


def sequential_layers(layers: Sequence[LayerFn], *, train: bool) -> Layers:
    """The :class:`Layers` of a sequential model, in pipeline mode's terms."""

    def stage(lo: int, hi: int) -> Stage:
        def fn(params, buffers, carry, args, kwargs, key):
            return _run(layers, lo, hi, params, buffers, carry, args, kwargs, train, key)

        names_p = tuple(dict.fromkeys(n for la in layers[lo:hi] for n in la.params))
        names_b = tuple(dict.fromkeys(n for la in layers[lo:hi] for n in la.buffers))
        return Stage(fn, names_p, names_b)

    # The first layer receives the model's inputs, the others the previous output: only
    # from the second layer on can equal keys mean the same function of the carry.
    keys = [None] + [la.signature for la in layers[1:]]
    return Layers([la.name for la in layers], [la.cost for la in layers], stage,
                  signature=keys.__getitem__ if any(k is not None for k in keys) else None)


def state_shapes(tree: Any) -> tuple:
    """The structure, shapes and dtypes of ``tree``'s arrays (hashable: part of a
    layer's structural key)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


def tree_size(tree: Any) -> int:
    """The number of elements of the arrays in ``tree`` (a layer's balancing cost)."""
    return sum(math.prod(getattr(x, "shape", ())) for x in jax.tree.leaves(tree))
