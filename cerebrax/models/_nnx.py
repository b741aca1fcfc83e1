"""flax ``nnx`` modules in ``cstorch.compile``: the adapter and the module's layers."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ..errors import ConfigError
from ..wse import Layers
from ._adapter import ModelAdapter, flatten_named
from ._sequential import LayerCall, LayerFn, sequential_layers, state_shapes, tree_size

__all__ = ["NnxAdapter", "is_nnx", "nnx_is_training", "nnx_layer_fns"]

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


def is_nnx(model: Any) -> bool:
    """Whether ``model`` is a ``flax.nnx.Module`` (an instance implies ``flax.nnx`` was
    imported: where it was not, flax's import, a third of a second, is not paid)."""
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(model, nnx.Module)


def nnx_is_training(module: Any) -> bool:
    """Whether an nnx module is in train mode (its first mode-carrying layer says)."""
    from flax import nnx

    for _, node in nnx.iter_graph(module):
        if hasattr(node, "deterministic") and node.deterministic is not None:
            return not node.deterministic
        if hasattr(node, "use_running_average") and node.use_running_average is not None:
            return not node.use_running_average
    return True


class NnxAdapter(ModelAdapter):
    def __init__(self, module: Any):
        from flax import nnx

        self._nnx = nnx
        was_training = nnx_is_training(module)
        module.train()
        self._graph_train, params, rest = nnx.split(module, nnx.Param, ...)
        module.eval()
        self._graph_eval = nnx.split(module, nnx.Param, ...)[0]
        module.train() if was_training else module.eval()
        self._params, self._params_def = flatten_named(params)
        self._buffers, self._buffers_def = flatten_named(rest)
        self.initially_training = was_training
        # The layers for pipeline mode are split here, outside any trace (nnx modules
        # cannot switch modes inside one); a module without layers fails only if used.
        try:
            self._layer_fns = nnx_layer_fns(module, list(self._params), list(self._buffers))
        except ConfigError as e:
            self._layer_fns, self._layer_error = None, e

    def params(self) -> dict[str, Any]:
        return self._params

    def buffers(self) -> dict[str, Any]:
        return self._buffers

    def apply(self, params, buffers, args, kwargs, *, train, key):
        nnx = self._nnx
        p = jax.tree.unflatten(self._params_def, list(params.values()))
        b = jax.tree.unflatten(self._buffers_def, list(buffers.values()))
        module = nnx.merge(self._graph_train if train else self._graph_eval, p, b)
        out = module(*args, **kwargs)
        _, _, new_b = nnx.split(module, nnx.Param, ...)
        new_named, _ = flatten_named(new_b)
        return out, new_named

    def pipeline_layers(self, params, buffers, args, kwargs, *, train) -> Layers:
        if self._layer_fns is None:
            raise self._layer_error
        return sequential_layers(self._layer_fns, train=train)


def nnx_layer_fns(module: Any, param_names: Sequence[str], buffer_names: Sequence[str]
                  ) -> list[LayerFn]:
    """Layers of an ``nnx.Sequential`` (or a module applying its ``layers`` in order).

    ``param_names`` / ``buffer_names`` are the whole module's state names; state
    outside the layers means the module computes more than its layers, which pipeline
    mode cannot split: a :class:`ConfigError` says so.
    """
    from flax import nnx

    layers = getattr(module, "layers", None)
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or not layers:
        raise ConfigError(MSG_NNX_LAYERS.format(
            problem=f"{type(module).__name__} has no `layers` list."))
    was_training = nnx_is_training(module)
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
            fns.append(LayerFn(name, (), (), 1, _plain_call(layer), signature=("fn", layer)))
            continue
        _, p, rest = nnx.split(layer, nnx.Param, ...)
        p_named, p_def = flatten_named(p)
        b_named, b_def = flatten_named(rest)
        p_full = tuple(f"{name}.{n}" for n in p_named)
        b_full = tuple(f"{name}.{n}" for n in b_named)
        covered.update(p_full + b_full)
        # Equal graphs (module types and static fields, in both modes) and equal state
        # shapes: the same function of the layer's state and input.
        signature = ("nnx", graphs[True][i], graphs[False][i], state_shapes(p), state_shapes(rest))
        fns.append(LayerFn(name, p_full, b_full, max(tree_size(p), 1), _nnx_call(
            graphs[True][i], graphs[False][i], p_def, b_def, b_full), signature=signature))
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

        p = jax.tree.unflatten(p_def, list(params.values()))
        b = jax.tree.unflatten(b_def, list(buffers.values()))
        layer = nnx.merge(graph_train if train else graph_eval, p, b)
        out = layer(*args, **kwargs)
        new_b, _ = flatten_named(nnx.split(layer, nnx.Param, ...)[2])
        return out, dict(zip(b_full, new_b.values()))

    return call
