"""``cstorch.compile``: wrap a model so that its state lives in registered slots.

A compiled model owns its parameters (:class:`~cerebrax.Parameter`, one per
state-dict name) and buffers. Calling it inside a traced step runs the model's pure
apply function on the step's tracers; calling it outside a step runs a jitted forward
on the current values. How the call runs on the backend's layout (one device, micro-
batches, a pipeline of stages) is :func:`cerebrax.wse.run_model`'s decision. The kinds
of models ``compile`` accepts are adapters behind one seam, :class:`ModelAdapter`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _placement, _step, wse
from .._filters import is_array, is_prng_key, is_torch_module, is_torch_tensor
from .._precision import cast_floating, compute_dtype, torch_autocast_state
from .._runtime import RUNTIME
from .._step import as_jax, to_numpy, torch_leaves_to_jax
from .._tree import ARRAY, combine, partition
from ..backend import Backend, get_or_create_backend
from ..errors import ConfigError, StateError
from ._adapter import ModelAdapter
from ._functional import FunctionalAdapter, FunctionalModel
from ._nnx import NnxAdapter, is_nnx

__all__ = ["CompiledModel", "compile", "register_model_adapter", "resolve_parameter"]

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



def _torch_adapter(model: Any) -> ModelAdapter:
    try:
        from ._torch import TorchModelAdapter
    except ImportError as e:
        raise ConfigError(
            f"cstorch.compile() got a torch.nn.Module ({type(model).__name__}), which needs "
            "the torch bridge (package `torch_bridge`, installed with the `torch` extra), "
            f"which could not be imported ({e}). Install it with pip install "
            "\"cerebrax[torch]\", or wrap a JAX function with cstorch.FunctionalModel or "
            "pass a flax.nnx.Module."
        ) from e
    return TorchModelAdapter(model)


# compile()'s built-in kinds of model, checked after the registered ones.
RUNTIME.model_adapters.extend([
    (lambda m: isinstance(m, FunctionalModel), FunctionalAdapter),
    (is_nnx, NnxAdapter),
    (is_torch_module, _torch_adapter),
])


def register_model_adapter(
    predicate: Callable[[Any], bool], factory: Callable[[Any], ModelAdapter]
) -> None:
    """Teaches ``compile`` a new kind of model (checked before the built-in kinds)."""
    RUNTIME.model_adapters.insert(0, (predicate, factory))


def resolve_parameter(obj: Any) -> _step.Parameter | None:
    """The compiled parameter standing for ``obj`` (itself, or an aliased original).

    An original torch parameter also passes on its current ``requires_grad``, so a
    parameter frozen after ``compile`` but before the optimizer is built stays fixed.
    ``compile`` made the link (:func:`cerebrax._step.alias_parameter`): it goes away with
    the original object, and with ``cstorch.reset()``.
    """
    if isinstance(obj, _step.Parameter):
        return obj
    p = _step.aliased_parameter(obj)
    if p is not None and isinstance(getattr(obj, "requires_grad", None), bool):
        p.requires_grad = obj.requires_grad
    return p


class IncompatibleKeys(NamedTuple):
    """What :meth:`CompiledModel.load_state_dict` returns, as torch's: the model's
    state-dict names the state dict lacked (``missing_keys``) and its names the model
    does not have (``unexpected_keys``)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class CompiledModel:
    """A model prepared for traced steps; returned by :func:`compile`.

    It behaves like the module it wraps: call it on inputs, and use ``parameters()``,
    ``named_parameters()``, ``state_dict()``, ``load_state_dict()``, ``train()`` and
    ``eval()``. Its state lives in registered slots that traced steps update.
    """

    def __init__(self, model: Any, adapter: ModelAdapter, backend: Backend):
        self.model = model
        self.backend = backend
        self._adapter = adapter
        frozen = adapter.frozen_parameters()
        self._params = {
            name: _step.Parameter(_place(v, backend), name=name, owner=self,
                                   requires_grad=name not in frozen)
            for name, v in adapter.params().items()
        }
        self._buffers = {
            name: _step.StateRef(_place(v, backend), name=name)
            for name, v in adapter.buffers().items()
        }
        self._rng = (
            _step.StateRef(jax.random.key_data(adapter.initial_key()), name="model rng")
            if adapter.needs_key else None
        )
        for original, name in adapter.parameter_aliases().items():
            _step.alias_parameter(original, self._params[name])
        self._training = bool(getattr(adapter, "initially_training", True))
        self._eager = {}
        adapter.attach(self)

    # ---- torch.nn.Module-like surface ---------------------------------------------------
    def parameters(self) -> list[_step.Parameter]:
        """The model's parameters (:class:`~cerebrax.Parameter`), frozen ones included.

        Unlike torch's ``parameters()`` it returns a list, not a generator, and takes no
        ``recurse`` argument; a tied weight appears once, as in torch.
        """
        return list(self._params.values())

    def named_parameters(self) -> Iterator[tuple[str, _step.Parameter]]:
        """An iterator of ``(state-dict name, parameter)`` pairs, as :meth:`parameters`
        lists them. Unlike torch's it takes no arguments (``prefix``, ``recurse``,
        ``remove_duplicate``)."""
        return iter(self._params.items())

    def buffers(self) -> list[_step.StateRef]:
        """The model's buffers (non-trained state, e.g. batch-norm statistics).

        Unlike torch's ``buffers()`` it returns a list, not a generator, of state slots
        (:class:`~cerebrax._step.StateRef`: read a buffer with ``b.value``), not tensors.
        """
        return list(self._buffers.values())

    def named_buffers(self) -> Iterator[tuple[str, _step.StateRef]]:
        """An iterator of ``(state-dict name, buffer slot)`` pairs, as :meth:`buffers`
        lists them. Unlike torch's it takes no arguments."""
        return iter(self._buffers.items())

    @property
    def device(self) -> Any:
        """The backend's torch device (cstorch's ``compiled_model.device``): where torch
        code puts a tensor it makes for the step, ``torch.zeros(3).to(model.device)``."""
        return self.backend.torch_device

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
        """Sets train mode (``mode=True``) or eval mode and returns the model, as torch's.

        A torch model's own ``train(mode)`` runs too. The mode is part of a traced step's
        graph: a step compiled in one mode raises :class:`~cerebrax.errors.RecompileError`
        when called in the other.
        """
        self.training = bool(mode)
        return self

    def eval(self) -> CompiledModel:
        """Sets eval mode and returns the model (``train(False)``)."""
        return self.train(False)

    def _slots(self) -> dict[str, _step.StateRef]:
        """Every state-dict name (tied aliases included) -> the slot holding its value."""
        order = self._adapter.state_dict_order(list(self._params), list(self._buffers))
        aliases = self._adapter.state_dict_aliases()
        slots = {**self._params, **self._buffers}
        return {name: slots[aliases.get(name, name)] for name in order}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies (numpy) of every parameter and buffer, by state-dict name.

        Like torch's, a tied weight appears under each of its names, as one array. A
        PRNG key kept as state (an nnx module's ``Rngs``, e.g. for Dropout) appears as
        its key data (``jax.random.key_data``: uint32), which checkpoints hold and
        :meth:`load_state_dict` turns back into the key.
        """
        # Host sync point: waits for the steps that produce these values.
        slots = self._slots()
        copies: dict[int, np.ndarray] = {}
        for ref in slots.values():
            if id(ref) not in copies:
                copies[id(ref)] = _key_data(ref.value)
        _placement.start_host_copies(v for v in copies.values() if isinstance(v, jax.Array))
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

    def _write_slot(self, name: str, ref: _step.StateRef, value: Any) -> None:
        value = to_numpy(value)
        old = ref.stored
        typed_key = is_prng_key(old)
        want = _key_data(old) if typed_key else old  # a key is loaded from its data
        if tuple(value.shape) != tuple(want.shape):
            raise StateError(
                f"size mismatch for {name!r}: the checkpoint has shape "
                f"{tuple(value.shape)}, the model has {tuple(want.shape)}."
            )
        new = jnp.asarray(value, dtype=want.dtype)
        if typed_key:
            new = jax.random.wrap_key_data(new, impl=jax.random.key_impl(old))
        ref.value = jax.device_put(new, self.backend.jax_device)

    # ---- calling ------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = _step.active_context()
        if ctx is None:
            return self._call_eagerly(args, kwargs)
        ctx.note_model(self)
        key = None
        if self._rng is not None:
            key, self._rng.value = jax.random.split(self._rng.value)
        # A torch model's integer inputs keep their torch dtype in forward (an int32
        # tensor stays int32), though JAX holds both torch int32 and int64 as int32.
        with self._adapter.calling_with(args, kwargs):
            out, new_buffers = self._forward(
                {n: p.value for n, p in self._params.items()},
                {n: b.value for n, b in self._buffers.items()},
                key, *as_jax((args, kwargs)), self.training,
            )
        for name, value in new_buffers.items():
            self._buffers[name].value = value
        if self.is_torch and not _torch_grad_enabled():  # called under torch.no_grad()
            out = jax.tree.map(_no_gradient, out)
        # Like in, like out: a torch model called on torch tensors returns torch tensors
        # (for the torch loss after it); called on JAX or numpy values, JAX arrays.
        torch_in = self.is_torch and any(map(is_torch_tensor, jax.tree.leaves(
            (args, kwargs), is_leaf=is_torch_tensor)))
        return self._adapter.outputs(out, torch_tensors=torch_in)

    @property
    def is_torch(self) -> bool:
        """Whether the model is a torch module (a traced step then sees torch inputs as
        torch tensors)."""
        return self._adapter.is_torch

    def _forward(self, params, buffers, key, args, kwargs, train):
        dtype = compute_dtype(self.backend, torch_model=self.is_torch)
        if dtype is not None:
            params, buffers = cast_floating(params, dtype), cast_floating(buffers, dtype)
            args, kwargs = cast_floating((args, kwargs), dtype)

        def apply(p, b, a, kw, k):
            return self._adapter.apply(p, b, a, kw, train=train, key=k)

        def layers_for(micro_args: tuple, micro_kwargs: dict) -> wse.Layers:
            layers = self._adapter.pipeline_layers(params, buffers, micro_args, micro_kwargs,
                                                   train=train)
            if layers is None:
                raise ConfigError(MSG_NO_LAYERS.format(kind=type(self.model).__name__))
            return layers

        with self.backend.lowering():  # a torch module's graph, for this platform
            out, new_buffers = wse.run_model(self.backend, apply, layers_for, params, buffers,
                                             args, kwargs, key=key)
        if dtype is not None:
            out = cast_floating(out, jnp.float32)
            new_buffers = {
                n: v.astype(self._buffers[n].stored.dtype) for n, v in new_buffers.items()
            }
        return out, new_buffers

    def _call_eagerly(self, args: tuple, kwargs: dict) -> Any:
        """A forward outside a traced step: a jitted call on the current values.

        Array inputs are traced; the others (bools, ints, strings) are constants of the
        jitted call, one compile per distinct value, as in a traced step.
        """
        arrays, skeleton = partition(torch_leaves_to_jax((args, kwargs)),
                                     lambda x: (x, None) if is_array(x) else None)
        train = self.training
        static = tuple(x if x is ARRAY else _static_key(x) for x in skeleton.leaves)
        # The precision policy (set_half_dtype, amp.autocast) and torch's autocast are
        # read when the call is traced, so what they decide is part of the cache key.
        cache_key = (train, skeleton.treedef, static,
                     str(compute_dtype(self.backend, torch_model=self.is_torch)),
                     torch_autocast_state() if self.is_torch else ())
        fn = self._eager.get(cache_key)
        if fn is None:
            def forward(p, b, k, arrays):
                a, kw = combine(arrays, skeleton)
                return self._forward(p, b, k, a, kw, train)

            fn = self._eager[cache_key] = jax.jit(forward)
        key = None
        if self._rng is not None:
            key, new = jax.random.split(self._rng.value)
            self._rng.value = new
        params = {n: p.value for n, p in self._params.items()}
        buffers = {n: b.value for n, b in self._buffers.items()}
        layout = getattr(self.backend, "layout", None)
        if layout is not None:
            # On a wafer mesh every value of the call lives on the mesh (state in its
            # layout, which a traced step may have placed already; inputs and the
            # key replicated).
            params, buffers = layout.place_state(params), layout.place_state(buffers)
            arrays = [jax.device_put(x, layout.replicated) for x in arrays]
            key = None if key is None else jax.device_put(key, layout.replicated)
        out, new_buffers = fn(params, buffers, key, arrays)
        for name, value in new_buffers.items():
            self._buffers[name].value = value
        return self._adapter.outputs(out, torch_tensors=False)

    def __repr__(self) -> str:
        n = sum(int(np.prod(p.shape)) for p in self._params.values())
        return (f"CompiledModel({type(self.model).__name__}, {len(self._params)} parameters, "
                f"{n:,} values, backend={self.backend.backend_type})")


def _static_key(x: Any) -> Any:
    """A non-array input as part of an eager call's cache key."""
    try:
        hash(x)
    except TypeError:
        return (type(x).__name__, repr(x))
    return (type(x).__name__, x)


def _place(value: Any, backend: Backend) -> jax.Array:
    if not isinstance(value, jax.Array):
        value = to_numpy(value)
    return jax.device_put(value, backend.jax_device)


def compile(model: Any, backend: Backend | str | None = None) -> CompiledModel:  # noqa: A001
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
    resolved = get_or_create_backend(backend)
    if isinstance(model, CompiledModel):
        raise ConfigError("cstorch.compile() got a model that is already compiled.")
    for predicate, factory in RUNTIME.model_adapters:
        if predicate(model):
            return CompiledModel(model, factory(model), resolved)
    raise ConfigError(
        f"cstorch.compile() does not know how to compile a {type(model).__name__}. "
        "Pass a cstorch.FunctionalModel(apply_fn, params), a flax.nnx.Module or a "
        "torch.nn.Module, or teach it with cerebrax.register_model_adapter()."
    )


def _key_data(value: Any) -> Any:
    """``value``, or the uint32 data of a typed PRNG key (numpy cannot hold a key)."""
    return jax.random.key_data(value) if is_prng_key(value) else value


def _torch_grad_enabled() -> bool:
    import torch

    return torch.is_grad_enabled()


def _no_gradient(value: Any) -> Any:
    return jax.lax.stop_gradient(value) if isinstance(value, jax.Array) else value
