"""``cstorch.compile``: wrap a model so that its state lives in registered slots.

A compiled model owns its parameters (:class:`~cerebrax._state.Parameter`, one per
state-dict name) and buffers. Calling it inside a traced step runs the model's pure
apply function on the step's tracers; calling it outside a step runs a jitted forward
on the current values. The kinds of models it accepts are adapters behind one seam,
:class:`ModelAdapter`: :class:`FunctionalModel`, ``flax.nnx.Module``, and (through
the torch bridge) ``torch.nn.Module``.
"""

from __future__ import annotations

import abc
import collections
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _state
from .amp._precision import cast_floating, compute_dtype
from .backend import _backend
from .errors import ConfigError, StateError

__all__ = ["CompiledModel", "FunctionalModel", "ModelAdapter", "compile",
           "register_model_adapter"]

MSG_NO_LAYERS = """\
ClusterConfig(execution_mode="pipeline") splits the model into stages between its
layers, but this {kind} gives no layers to split. Fix, by kind of model:
  - torch.nn.Module: layers are found from its child modules (blocks.0, fc1, ...);
  - cstorch.FunctionalModel: pass the model as layers, e.g.
        FunctionalModel(layers={{"fc1": (dense, p1), "fc2": (dense, p2)}})
    instead of FunctionalModel(apply_fn, params);
  - flax nnx: use nnx.Sequential(...) or a module whose `layers` list it applies in
    order;
or use execution_mode="replica" or "weight_streaming" for this model."""

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class ModelAdapter(abc.ABC):
    """Turns one kind of model into flat named state and a pure apply function.

    ``params`` and ``buffers`` map state-dict names (``"fc1.weight"``) to arrays.
    ``apply`` runs the model on those dicts and returns ``(outputs, new_buffers)``.
    """

    needs_key: bool = False

    @abc.abstractmethod
    def params(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def buffers(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def apply(self, params: dict, buffers: dict, args: tuple, kwargs: dict, *,
              train: bool, key: jax.Array | None) -> tuple[Any, dict]: ...

    def parameter_aliases(self) -> dict[int, str]:
        """``id(original parameter object) -> name``, for optimizers given those objects."""
        return {}

    def state_dict_order(self, params: list[str], buffers: list[str]) -> list[str]:
        """The names of ``state_dict()`` in order, aliases (see below) included."""
        return params + buffers

    def state_dict_aliases(self) -> dict[str, str]:
        """Extra state-dict names of stored values: ``{alias: stored name}``.

        A tied weight is stored once but, as in torch, appears in the state dict under
        every name (``{"lm_head.weight": "wte.weight"}``).
        """
        return {}

    def frozen_parameters(self) -> set[str]:
        """Names of parameters that are not trained (torch's ``requires_grad=False``)."""
        return set()

    def is_training(self) -> bool | None:
        """The model's own train/eval flag, or None when the compiled model keeps it."""
        return None

    def set_training(self, mode: bool) -> None:
        """Switches the model's own train/eval flag (when :meth:`is_training` has one)."""

    def attach(self, compiled: CompiledModel) -> None:
        """Called once the compiled model exists (e.g. to hook the original model)."""

    def pipeline_layers(self, params: dict, buffers: dict, args: tuple, kwargs: dict, *,
                        train: bool) -> Any:
        """The model's layers for pipeline mode (a :class:`cerebrax.wse.Layers`).

        ``args`` and ``kwargs`` look like one micro-batch's inputs (array leaves may be
        ``jax.ShapeDtypeStruct``). None (the default) means the model has no layers to
        split; pipeline mode then raises a :class:`ConfigError` naming the fix.
        """
        return None


def _flatten_named(tree: Any) -> tuple[dict[str, Any], Any]:
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    named = {}
    for path, leaf in pairs:
        # flax.nnx variables flatten to `.value` attributes: name them by their path.
        path = tuple(k for k in path
                     if not (isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value"))
        name = jax.tree_util.keystr(path, simple=True, separator=".")
        named[name or "param"] = leaf
    return named, treedef


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
      >>> model = FunctionalModel(apply, {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)})
      >>> dense = lambda p, x: jnp.tanh(x @ p["w"])
      >>> deep = FunctionalModel(layers={"fc1": (dense, {"w": jnp.zeros((3, 4))}),
      ...                                "fc2": (dense, {"w": jnp.zeros((4, 2))})})
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


class _FunctionalAdapter(ModelAdapter):
    def __init__(self, model: FunctionalModel):
        self.model = model
        self._params, self._params_def = _flatten_named(model.params)
        if model.buffers is None:
            self._buffers, self._buffers_def = {}, None
        else:
            self._buffers, self._buffers_def = _flatten_named(model.buffers)
        self._layers = None
        if model.layers is not None:
            from .wse._layers import functional_layer_fns

            self._layers = functional_layer_fns(model.layers)
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

    def pipeline_layers(self, params, buffers, args, kwargs, *, train):
        if self._layers is None:
            return None
        from .wse._layers import sequential_layers

        return sequential_layers(self._layers, train=train)

    def apply(self, params, buffers, args, kwargs, *, train, key):
        if self._layers is not None:
            from .wse._layers import run_sequential

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
        new_named, new_def = _flatten_named(new_b)
        if new_def != self._buffers_def:
            raise StateError(
                "FunctionalModel's apply_fn returned buffers with structure "
                f"{new_def}, expected {self._buffers_def}."
            )
        return out, new_named


class _NnxAdapter(ModelAdapter):
    def __init__(self, module: Any):
        from flax import nnx

        self._nnx = nnx
        was_training = _nnx_is_training(module)
        module.train()
        self._graph_train, params, rest = nnx.split(module, nnx.Param, ...)
        module.eval()
        self._graph_eval = nnx.split(module, nnx.Param, ...)[0]
        module.train() if was_training else module.eval()
        self._params, self._params_def = _flatten_named(params)
        self._buffers, self._buffers_def = _flatten_named(rest)
        self.initially_training = was_training
        # The layers for pipeline mode are split here, outside any trace (nnx modules
        # cannot switch modes inside one); a module without layers fails only if used.
        from .wse._layers import nnx_layer_fns

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
        new_named, _ = _flatten_named(new_b)
        return out, new_named

    def pipeline_layers(self, params, buffers, args, kwargs, *, train):
        from .wse._layers import sequential_layers

        if self._layer_fns is None:
            raise self._layer_error
        return sequential_layers(self._layer_fns, train=train)


def _nnx_is_training(module: Any) -> bool:
    from flax import nnx

    for _, node in nnx.iter_graph(module):
        if hasattr(node, "deterministic") and node.deterministic is not None:
            return not node.deterministic
        if hasattr(node, "use_running_average") and node.use_running_average is not None:
            return not node.use_running_average
    return True


def _is_nnx(model: Any) -> bool:
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover - flax is a dependency
        return False
    return isinstance(model, nnx.Module)


def _is_torch_module(model: Any) -> bool:
    return any(c.__module__.startswith("torch.nn") and c.__name__ == "Module"
               for c in type(model).__mro__)


def _torch_adapter(model: Any) -> ModelAdapter:
    try:
        import torch_bridge
        factory = torch_bridge.model_adapter
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"cstorch.compile() got a torch.nn.Module ({type(model).__name__}), which needs "
            "the torch bridge (package `torch_bridge`, installed with the `torch` extra). "
            "It is not available in this installation. Meanwhile wrap a JAX function with "
            "cstorch.FunctionalModel or pass a flax.nnx.Module."
        ) from e
    return factory(model)


_ADAPTERS: list[tuple[Callable[[Any], bool], Callable[[Any], ModelAdapter]]] = [
    (lambda m: isinstance(m, FunctionalModel), _FunctionalAdapter),
    (_is_nnx, _NnxAdapter),
    (_is_torch_module, _torch_adapter),
]


def register_model_adapter(
    predicate: Callable[[Any], bool], factory: Callable[[Any], ModelAdapter]
) -> None:
    """Teaches ``compile`` a new kind of model (checked before the built-in kinds)."""
    _ADAPTERS.insert(0, (predicate, factory))


# id(original parameter object, e.g. a torch nn.Parameter) -> compiled Parameter.
_ALIASES: dict[int, _state.Parameter] = {}


def resolve_parameter(obj: Any) -> _state.Parameter | None:
    """The compiled parameter standing for ``obj`` (itself, or an aliased original).

    An original torch parameter also passes on its current ``requires_grad``, so a
    parameter frozen after ``compile`` but before the optimizer is built stays fixed.
    """
    if isinstance(obj, _state.Parameter):
        return obj
    p = _ALIASES.get(id(obj))
    if p is not None and isinstance(getattr(obj, "requires_grad", None), bool):
        p.requires_grad = obj.requires_grad
    return p


class CompiledModel:
    """A model prepared for traced steps; returned by :func:`compile`.

    It behaves like the module it wraps: call it on inputs, and use ``parameters()``,
    ``named_parameters()``, ``state_dict()``, ``load_state_dict()``, ``train()`` and
    ``eval()``. Its state lives in registered slots that traced steps update.
    """

    def __init__(self, model: Any, adapter: ModelAdapter, backend: _backend.Backend):
        self.model = model
        self.backend = backend
        self._adapter = adapter
        frozen = adapter.frozen_parameters()
        self._params = {
            name: _state.Parameter(_place(v, backend), name=name, owner=self,
                                   requires_grad=name not in frozen)
            for name, v in adapter.params().items()
        }
        self._buffers = {
            name: _state.StateRef(_place(v, backend), name=name)
            for name, v in adapter.buffers().items()
        }
        self._rng = (
            _state.StateRef(jax.random.key_data(jax.random.key(0)), name="model rng")
            if adapter.needs_key else None
        )
        for ident, name in adapter.parameter_aliases().items():
            _ALIASES[ident] = self._params[name]
        self._training = bool(getattr(adapter, "initially_training", True))
        self._eager = {}
        adapter.attach(self)

    # ---- torch.nn.Module-like surface ---------------------------------------------------
    def parameters(self) -> list[_state.Parameter]:
        return list(self._params.values())

    def named_parameters(self) -> Iterator[tuple[str, _state.Parameter]]:
        return iter(self._params.items())

    def buffers(self) -> list[_state.StateRef]:
        return list(self._buffers.values())

    def named_buffers(self) -> Iterator[tuple[str, _state.StateRef]]:
        return iter(self._buffers.items())

    @property
    def training(self) -> bool:
        """Train or eval mode; for a torch module, the original module's own flag."""
        mode = self._adapter.is_training()
        return self._training if mode is None else bool(mode)

    @training.setter
    def training(self, mode: bool) -> None:
        self._training = bool(mode)
        self._adapter.set_training(bool(mode))

    def train(self, mode: bool = True) -> CompiledModel:
        self.training = bool(mode)
        return self

    def eval(self) -> CompiledModel:
        return self.train(False)

    def _slots(self) -> dict[str, _state.StateRef]:
        """Every state-dict name (tied aliases included) -> the slot holding its value."""
        order = self._adapter.state_dict_order(list(self._params), list(self._buffers))
        aliases = self._adapter.state_dict_aliases()
        slots = {**self._params, **self._buffers}
        return {name: slots[aliases.get(name, name)] for name in order}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies (numpy) of every parameter and buffer, by state-dict name.

        Like torch's, a tied weight appears under each of its names, as one array.
        """
        # Host sync point: waits for the steps that produce these values.
        slots = self._slots()
        copies: dict[int, np.ndarray] = {}
        for ref in slots.values():
            if id(ref) not in copies:
                copies[id(ref)] = ref.value
        for value in copies.values():
            if isinstance(value, jax.Array):
                value.copy_to_host_async()  # start every transfer before the first wait
        copies = {k: np.array(v) for k, v in copies.items()}  # owned copies, not views
        return {name: copies[id(ref)] for name, ref in slots.items()}

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True):
        """Writes parameters and buffers from ``state_dict`` (shapes must match).

        Values may be numpy, JAX or torch arrays, or lazy checkpoint arrays; each is cast
        to the dtype of its slot. A tied weight is loaded from any of its names (the
        last one present wins, as in torch), and counts as missing only when all are.
        """
        slots = self._slots()
        present = {id(ref) for name, ref in slots.items() if name in state_dict}
        missing = [k for k, ref in slots.items() if id(ref) not in present]
        unexpected = [k for k in state_dict if k not in slots]
        if strict and (missing or unexpected):
            raise StateError(
                "Error(s) in loading state_dict: "
                + (f"missing keys {missing}" if missing else "")
                + ("; " if missing and unexpected else "")
                + (f"unexpected keys {unexpected}" if unexpected else "")
                + ". Pass strict=False to load the keys that match."
            )
        for name, ref in slots.items():
            if name in state_dict:
                self._write_slot(name, ref, state_dict[name])
        return IncompatibleKeys(missing, unexpected)

    def _write_slot(self, name: str, ref: _state.StateRef, value: Any) -> None:
        from ._interop import to_numpy

        value = to_numpy(value)
        old = ref._value
        if tuple(value.shape) != tuple(old.shape):
            raise StateError(
                f"size mismatch for {name!r}: the checkpoint has shape "
                f"{tuple(value.shape)}, the model has {tuple(old.shape)}."
            )
        ref.value = jax.device_put(jnp.asarray(value, dtype=old.dtype), self.backend.device)

    # ---- calling ------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = _state.active_context()
        if ctx is None:
            return self._call_eagerly(args, kwargs)
        ctx.note_model(self)
        key = None
        if self._rng is not None:
            key, self._rng.value = jax.random.split(self._rng.value)
        out, new_buffers = self._forward(
            {n: p.value for n, p in self._params.items()},
            {n: b.value for n, b in self._buffers.items()},
            key, args, kwargs, self.training,
        )
        for name, value in new_buffers.items():
            self._buffers[name].value = value
        return out

    def _forward(self, params, buffers, key, args, kwargs, train):
        dtype = compute_dtype(self.backend)
        if dtype is not None:
            params, buffers = cast_floating(params, dtype), cast_floating(buffers, dtype)
            args, kwargs = cast_floating((args, kwargs), dtype)
        wafer = getattr(self.backend, "wafer", None)
        cluster = getattr(self.backend, "cluster_config", None)
        if wafer is not None and wafer.mode == "pipeline":
            out, new_buffers = self._pipelined(wafer, params, buffers, args, kwargs, train, key)
        elif (cluster is not None and cluster.micro_batch_size is not None
              and cluster.execution_mode != "pipeline"):
            out, new_buffers = self._micro_batched(cluster, params, buffers, args, kwargs,
                                                   train, key)
        else:
            out, new_buffers = self._adapter.apply(params, buffers, args, kwargs, train=train,
                                                   key=key)
        if dtype is not None:
            out = cast_floating(out, jnp.float32)
            new_buffers = {
                n: v.astype(self._buffers[n]._value.dtype) for n, v in new_buffers.items()
            }
        return out, new_buffers

    def _micro_batched(self, cluster, params, buffers, args, kwargs, train, key):
        """The model call over micro-batches of ``cluster.micro_batch_size`` rows per
        system (weight-streaming and replica mode; see cerebrax.wse)."""
        from .wse._micro import micro_batched_apply

        layout = getattr(self.backend, "layout", None)
        if layout is not None and cluster.execution_mode == "replica":
            replicas = layout.wafer.inner_size
            if cluster.micro_batch_size % replicas:
                raise ConfigError(
                    f"ClusterConfig(execution_mode='replica', num_replicas={replicas}, "
                    f"micro_batch_size={cluster.micro_batch_size}): every micro-batch is "
                    f"split over the replicas, so micro_batch_size must be a multiple of "
                    f"num_replicas. Fix: set micro_batch_size to "
                    f"{max(cluster.micro_batch_size // replicas, 1) * replicas}."
                )

        def apply(p, b, a, kw, k):
            return self._adapter.apply(p, b, a, kw, train=train, key=k)

        return micro_batched_apply(apply, cluster.micro_batch_size, cluster.num_csx, params,
                                   buffers, args, kwargs, key,
                                   None if layout is None else layout.batch)

    def _pipelined(self, wafer, params, buffers, args, kwargs, train, key):
        """The model call as a GPipe schedule over the wafer's stages (cerebrax.wse)."""
        from .wse._pipeline import pipelined_apply

        def layers_for(micro_args: tuple, micro_kwargs: dict) -> Any:
            layers = self._adapter.pipeline_layers(params, buffers, micro_args, micro_kwargs,
                                                   train=train)
            if layers is None:
                raise ConfigError(MSG_NO_LAYERS.format(kind=type(self.model).__name__))
            return layers

        return pipelined_apply(layers_for, wafer, wafer.micro_batch_size, params, buffers,
                               args, kwargs, key=key)

    def _call_eagerly(self, args: tuple, kwargs: dict) -> Any:
        """A forward outside a traced step: a jitted call on the current values."""
        args, kwargs = _torch_leaves_to_jax((args, kwargs))
        train = self.training
        fn = self._eager.get(train)
        if fn is None:
            fn = jax.jit(lambda p, b, k, a, kw: self._forward(p, b, k, a, kw, train))
            self._eager[train] = fn
        key = None
        if self._rng is not None:
            key, new = jax.random.split(self._rng.value)
            self._rng.value = new
        params = {n: p.value for n, p in self._params.items()}
        buffers = {n: b.value for n, b in self._buffers.items()}
        layout = getattr(self.backend, "layout", None)
        if layout is not None:
            # On a wafer mesh every value of the call lives on the mesh (state in its
            # layout, which a traced step may have placed already; inputs replicated).
            params, buffers = layout.place_state(params), layout.place_state(buffers)
            args, kwargs = jax.tree.map(
                lambda x: jax.device_put(x, layout.replicated)
                if isinstance(x, (jax.Array, np.ndarray)) else x, (args, kwargs))
        out, new_buffers = fn(params, buffers, key, args, kwargs)
        for name, value in new_buffers.items():
            self._buffers[name].value = value
        return out

    def __repr__(self) -> str:
        n = sum(int(np.prod(p.shape)) for p in self._params.values())
        return (f"CompiledModel({type(self.model).__name__}, {len(self._params)} parameters, "
                f"{n:,} values, backend={self.backend.backend_type})")


def _torch_leaves_to_jax(tree: Any) -> Any:
    """``tree`` with torch tensor leaves as JAX arrays (shared through DLPack if possible)."""
    from ._interop import is_torch_tensor, torch_to_jax

    if not any(is_torch_tensor(x) for x in jax.tree.leaves(tree, is_leaf=is_torch_tensor)):
        return tree
    return jax.tree.map(lambda x: torch_to_jax(x) if is_torch_tensor(x) else x, tree,
                        is_leaf=is_torch_tensor)


def _place(value: Any, backend: _backend.Backend) -> jax.Array:
    from ._interop import to_numpy

    if not isinstance(value, jax.Array):
        value = to_numpy(value)
    return jax.device_put(value, backend.device)


def compile(model: Any, backend: _backend.Backend | str | None = None) -> CompiledModel:  # noqa: A001
    """Prepares ``model`` for traced steps on ``backend``.

    Like ``torch.compile`` this compiles nothing yet: the step that uses the model is
    compiled at its first call, once the input shapes are known.

    Args:
      model: a :class:`FunctionalModel`, a ``flax.nnx.Module``, or a ``torch.nn.Module``
        (through the torch bridge).
      backend: a :class:`~cerebrax.backend.Backend`; ``"CPU"``, ``"GPU"``, ``"CSX"``; or
        ``"wse_ws"``, ``"wse_pipeline"``, ``"wse_replica"`` (CSX with that execution
        mode). None uses the current backend, or creates a CPU one.

    Returns:
      A :class:`CompiledModel`.
    """
    resolved = _backend.get_or_create_backend(backend)
    if isinstance(model, CompiledModel):
        raise ConfigError("cstorch.compile() got a model that is already compiled.")
    for predicate, factory in _ADAPTERS:
        if predicate(model):
            return CompiledModel(model, factory(model), resolved)
    raise ConfigError(
        f"cstorch.compile() does not know how to compile a {type(model).__name__}. "
        "Pass a cstorch.FunctionalModel(apply_fn, params), a flax.nnx.Module or a "
        "torch.nn.Module, or teach it with cerebrax.register_model_adapter()."
    )
