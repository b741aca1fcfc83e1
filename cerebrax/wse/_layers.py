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
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from ..errors import ConfigError
from ._pipeline import Layers, Stage

__all__ = ["LayerFn", "functional_layer_fns", "nnx_layer_fns", "run_sequential",
           "sequential_layers"]

# call(params, buffers, args, kwargs, train, key) -> (output, buffer updates)
LayerCall = Callable[[dict, dict, tuple, dict, bool, Any], tuple[Any, dict]]

MSG_NNX_LAYERS = """\
Pipeline mode splits a flax nnx model into stages by its layers, so it needs an
nnx.Sequential or a module whose `layers` attribute is the list of layers it applies
one after the other. {problem}
Wrong:
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.conv, self.bn, self.fc = nnx.Conv(...), nnx.BatchNorm(...), nnx.Linear(...)
Right:
    net = nnx.Sequential(nnx.Conv(...), nnx.BatchNorm(...), jax.nn.relu,
                         lambda h: h.mean(axis=(1, 2)), nnx.Linear(...))"""


@dataclasses.dataclass(frozen=True)
class LayerFn:
    """One layer: its name, its state names, a balancing cost and a pure call."""

    name: str
    params: tuple[str, ...]
    buffers: tuple[str, ...]
    cost: int
    call: LayerCall
    needs_key: bool = False


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

    return Layers([la.name for la in layers], [la.cost for la in layers], stage)


def _size(tree: Any) -> int:
    return sum(math.prod(getattr(x, "shape", ())) for x in jax.tree.leaves(tree))


# ---- FunctionalModel(layers=...) --------------------------------------------------------
def functional_layer_fns(named: Sequence[tuple[str, Any]]) -> list[LayerFn]:
    """Layers of a ``FunctionalModel(layers=...)``: ``[(name, FunctionalModel), ...]``."""
    from .._compile import _flatten_named

    fns = []
    for name, model in named:
        p_names, p_def = _flatten_named({name: model.params})
        p_names = {} if model.params is None else p_names
        if model.buffers is None:
            b_names, b_def = {}, None
        else:
            b_names, b_def = _flatten_named({name: model.buffers})
        try:
            accepted = inspect.signature(model.apply_fn).parameters
        except (TypeError, ValueError):
            accepted = {}
        call = _functional_call(name, model, p_def, b_def, "train" in accepted,
                                "key" in accepted)
        fns.append(LayerFn(name, tuple(p_names), tuple(b_names), max(_size(model.params), 1),
                           call, needs_key="key" in accepted))
    return fns


def _functional_call(name: str, model: Any, p_def: Any, b_def: Any, takes_train: bool,
                     takes_key: bool) -> LayerCall:
    def call(params, buffers, args, kwargs, train, key):
        from .._compile import _flatten_named

        extra = dict(kwargs)
        if takes_train:
            extra["train"] = train
        if takes_key:
            extra["key"] = key
        p = None if model.params is None else jax.tree.unflatten(
            p_def, list(params.values()))[name]
        if b_def is None:
            return model.apply_fn(p, *args, **extra), {}
        b = jax.tree.unflatten(b_def, list(buffers.values()))[name]
        out, new_b = model.apply_fn(p, b, *args, **extra)
        new_named, new_def = _flatten_named({name: new_b})
        if new_def != b_def:
            raise ConfigError(
                f"Layer {name!r} of the FunctionalModel returned buffers with structure "
                f"{new_def}, expected {b_def}."
            )
        return out, new_named

    return call


# ---- flax nnx ---------------------------------------------------------------------------
def nnx_layer_fns(module: Any, param_names: Sequence[str], buffer_names: Sequence[str]
                  ) -> list[LayerFn]:
    """Layers of an ``nnx.Sequential`` (or a module applying its ``layers`` in order).

    ``param_names`` / ``buffer_names`` are the whole module's state names; state
    outside the layers means the module computes more than its layers, which pipeline
    mode cannot split: a :class:`ConfigError` says so.
    """
    from flax import nnx

    from .._compile import _flatten_named

    layers = getattr(module, "layers", None)
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or not layers:
        raise ConfigError(MSG_NNX_LAYERS.format(
            problem=f"{type(module).__name__} has no `layers` list."))
    was_training = _training(module)
    graphs = {}
    for mode in (True, False):
        module.train() if mode else module.eval()
        graphs[mode] = [nnx.split(la, nnx.Param, ...)[0] if isinstance(la, nnx.Module)
                        else None for la in layers]
    module.train() if was_training else module.eval()
    fns, covered = [], set()
    for i, layer in enumerate(layers):
        name = f"layers.{i}"
        if not isinstance(layer, nnx.Module):
            if not callable(layer):
                raise ConfigError(MSG_NNX_LAYERS.format(
                    problem=f"Entry {i} of `layers` is not callable: {layer!r}."))
            fns.append(LayerFn(name, (), (), 1, _plain_call(layer)))
            continue
        _, p, rest = nnx.split(layer, nnx.Param, ...)
        p_named, p_def = _flatten_named(p)
        b_named, b_def = _flatten_named(rest)
        p_full = tuple(f"{name}.{n}" for n in p_named)
        b_full = tuple(f"{name}.{n}" for n in b_named)
        covered.update(p_full + b_full)
        fns.append(LayerFn(name, p_full, b_full, max(_size(p), 1), _nnx_call(
            graphs[True][i], graphs[False][i], p_def, b_def, b_full)))
    outside = [n for n in (*param_names, *buffer_names) if n not in covered]
    if outside:
        raise ConfigError(MSG_NNX_LAYERS.format(
            problem=f"{type(module).__name__} holds state outside `layers` "
            f"({', '.join(outside[:5])}), so its __call__ does more than apply them."))
    return fns


def _plain_call(fn: Callable) -> LayerCall:
    def call(params, buffers, args, kwargs, train, key):
        return fn(*args, **kwargs), {}

    return call


def _nnx_call(graph_train: Any, graph_eval: Any, p_def: Any, b_def: Any,
              b_full: tuple[str, ...]) -> LayerCall:
    def call(params, buffers, args, kwargs, train, key):
        from flax import nnx

        from .._compile import _flatten_named

        p = jax.tree.unflatten(p_def, list(params.values()))
        b = jax.tree.unflatten(b_def, list(buffers.values()))
        layer = nnx.merge(graph_train if train else graph_eval, p, b)
        out = layer(*args, **kwargs)
        new_b, _ = _flatten_named(nnx.split(layer, nnx.Param, ...)[2])
        return out, dict(zip(b_full, new_b.values()))

    return call


def _training(module: Any) -> bool:
    from .._compile import _nnx_is_training

    return _nnx_is_training(module)
