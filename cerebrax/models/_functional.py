"""``cstorch.FunctionalModel``: a model given as a pure function and its parameters, or
as a list of layers, and its adapter."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import jax

from ..errors import ConfigError, StateError
from ..wse import Layers
from ._adapter import ModelAdapter, flatten_named
from ._sequential import (
    LayerCall,
    LayerFn,
    run_sequential,
    sequential_layers,
    state_shapes,
    tree_size,
)

__all__ = ["FunctionalAdapter", "FunctionalModel"]


class FunctionalModel:
    """A model given as a pure function and its parameters, or as a list of layers.

    Args:
      apply_fn: without buffers ``apply_fn(params, *inputs) -> outputs``; with buffers
        ``apply_fn(params, buffers, *inputs) -> (outputs, new_buffers)``. If it takes a
        keyword ``train`` it receives the model's mode; if it takes ``key`` it receives
        a fresh PRNG key on every call (dropout and other random ops).
      params: a pytree of arrays (nested dicts give dotted state-dict names).
      buffers: a pytree of non-trainable arrays (e.g. BatchNorm statistics), or None.
      layers: instead of the three above, the model as a sequence of layers: a list of
        layers (named ``"0"``, ``"1"``, ...) or a dict ``{name: layer}``, where a layer
        is a ``FunctionalModel`` or a tuple ``(apply_fn, params)`` /
        ``(apply_fn, params, buffers)`` with the conventions above. The first layer
        receives the model's inputs, every later layer the previous layer's output (one
        positional argument); a layer that takes ``key`` gets ``fold_in(key, index)``.
        State-dict names are ``"{layer name}.{name in its params}"``. Pipeline mode
        (``ClusterConfig(execution_mode="pipeline")``) splits the model into stages
        between layers; every mode runs such a model unchanged.

    Example:
      >>> def apply(params, x):
      ...     return x @ params["w"] + params["b"]
      >>> model = cstorch.FunctionalModel(apply, {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)})
      >>> compiled = cstorch.compile(model, "CPU")
      >>> compiled(jnp.ones((1, 3)))
      Array([[3., 3.]], dtype=float32)
      >>> dense = lambda p, x: jnp.tanh(x @ p["w"])
      >>> deep = cstorch.FunctionalModel(layers={"fc1": (dense, {"w": jnp.zeros((3, 4))}),
      ...                                        "fc2": (dense, {"w": jnp.zeros((4, 2))})})
      >>> list(cstorch.compile(deep, "CPU").state_dict())
      ['fc1.w', 'fc2.w']
    """

    def __init__(self, apply_fn: Callable[..., Any] | None = None, params: Any = None,
                 buffers: Any = None, *, layers: Any = None):
        self.layers: list[tuple[str, FunctionalModel]] | None = None
        if layers is not None:
            if apply_fn is not None or params is not None or buffers is not None:
                raise ConfigError(
                    "FunctionalModel takes either apply_fn and params, or layers=, not both. "
                    "Fix: move the whole model into layers, or drop layers=."
                )
            self.layers = _named_layers(layers)
            self.apply_fn = None
            self.params = {name: la.params for name, la in self.layers}
            with_buffers = {name: la.buffers for name, la in self.layers
                            if la.buffers is not None}
            self.buffers = with_buffers or None
            return
        if not callable(apply_fn):
            raise ConfigError(f"FunctionalModel(apply_fn=...) must be callable, got {apply_fn!r}.")
        self.apply_fn = apply_fn
        self.params = params
        self.buffers = buffers


def _named_layers(layers: Any) -> list[tuple[str, FunctionalModel]]:
    items = list(layers.items()) if isinstance(layers, Mapping) else [
        (str(i), layer) for i, layer in enumerate(layers)]
    if not items:
        raise ConfigError("FunctionalModel(layers=...) got no layers.")
    named = []
    for name, layer in items:
        if isinstance(layer, tuple) and 2 <= len(layer) <= 3:
            layer = FunctionalModel(*layer)
        if not isinstance(layer, FunctionalModel) or layer.layers is not None:
            raise ConfigError(
                f"FunctionalModel(layers=...): layer {name!r} must be (apply_fn, params), "
                f"(apply_fn, params, buffers) or a FunctionalModel without layers, got "
                f"{type(layer).__name__}."
            )
        if not isinstance(name, str) or not name or "." in name:
            raise ConfigError(
                f"FunctionalModel(layers=...): layer names are non-empty strings without "
                f"dots, got {name!r}."
            )
        named.append((name, layer))
    return named


class FunctionalAdapter(ModelAdapter):
    def __init__(self, model: FunctionalModel):
        self.model = model
        self._params, self._params_def = flatten_named(model.params)
        if model.buffers is None:
            self._buffers, self._buffers_def = {}, None
        else:
            self._buffers, self._buffers_def = flatten_named(model.buffers)
        self._layers = None
        if model.layers is not None:
            self._layers = functional_layer_fns(model.layers)
            self._signatures = layer_signatures(model.layers)
            self._takes_train = False
            self.needs_key = any(layer.needs_key for layer in self._layers)
            return
        try:
            accepted = inspect.signature(model.apply_fn).parameters
        except (TypeError, ValueError):
            accepted = {}
        self._takes_train = "train" in accepted
        self.needs_key = "key" in accepted

    def params(self) -> dict[str, Any]:
        return self._params

    def buffers(self) -> dict[str, Any]:
        return self._buffers

    def pipeline_layers(self, params, buffers, args, kwargs, *, train) -> Layers | None:
        if self._layers is None:
            return None
        layers = sequential_layers(self._layers, train=train)
        return dataclasses.replace(layers, signature=self._signatures.__getitem__)

    def apply(self, params, buffers, args, kwargs, *, train, key):
        if self._layers is not None:
            return run_sequential(self._layers, params, buffers, args, kwargs,
                                  train=train, key=key)
        extra = dict(kwargs)
        if self._takes_train:
            extra["train"] = train
        if self.needs_key:
            extra["key"] = key
        p = jax.tree.unflatten(self._params_def, list(params.values()))
        if self._buffers_def is None:
            return self.model.apply_fn(p, *args, **extra), {}
        b = jax.tree.unflatten(self._buffers_def, list(buffers.values()))
        out, new_b = self.model.apply_fn(p, b, *args, **extra)
        new_named, new_def = flatten_named(new_b)
        if new_def != self._buffers_def:
            raise StateError(
                "FunctionalModel's apply_fn returned buffers with structure "
                f"{new_def}, expected {self._buffers_def}."
            )
        return out, new_named


def layer_signatures(named: Sequence[tuple[str, FunctionalModel]]) -> list[Hashable | None]:
    """Structural keys of a ``FunctionalModel(layers=...)``'s layers (see ``wse.Layers``).

    Two layers share a key when they have the same ``apply_fn`` object and parameters
    and buffers of the same structure, shapes and dtypes: they compute the same
    function of their parameters and input. The first layer receives the model's
    inputs rather than the previous layer's output, so it has no key.
    """

    keys: list[Hashable | None] = [None]
    for _, model in named[1:]:
        keys.append((model.apply_fn, state_shapes(model.params), state_shapes(model.buffers)))
    return keys


def functional_layer_fns(named: Sequence[tuple[str, Any]]) -> list[LayerFn]:
    """Layers of a ``FunctionalModel(layers=...)``: ``[(name, FunctionalModel), ...]``."""
    fns = []
    for name, model in named:
        p_names, p_def = flatten_named({name: model.params})
        p_names = {} if model.params is None else p_names
        if model.buffers is None:
            b_names, b_def = {}, None
        else:
            b_names, b_def = flatten_named({name: model.buffers})
        try:
            accepted = inspect.signature(model.apply_fn).parameters
        except (TypeError, ValueError):
            accepted = {}
        call = _functional_call(name, model, p_def, b_def, "train" in accepted,
                                "key" in accepted)
        fns.append(LayerFn(name, tuple(p_names), tuple(b_names), max(tree_size(model.params), 1),
                           call, needs_key="key" in accepted))
    return fns


def _functional_call(name: str, model: Any, p_def: Any, b_def: Any, takes_train: bool,
                     takes_key: bool) -> LayerCall:
    def call(params, buffers, args, kwargs, train, key):
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
        new_named, new_def = flatten_named({name: new_b})
        if new_def != b_def:
            raise ConfigError(
                f"Layer {name!r} of the FunctionalModel returned buffers with structure "
                f"{new_def}, expected {b_def}."
            )
        return out, new_named

    return call
