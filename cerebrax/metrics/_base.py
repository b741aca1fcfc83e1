"""``Metric``: accumulators in registered state, updated inside traced steps.

A metric follows reset / update / compute with explicit state: ``_initial_state``
gives the accumulators, ``_update`` is a pure function from the old accumulators and a
batch to the new ones, ``_compute`` a pure function from the accumulators to the value.
Inside a traced step ``metric(...)`` updates the accumulators in the graph; after the
steps ``float(metric)`` reads the final value.

The number of updates is registered state as well (an int32 counter), so an update
inside a traced step counts on every call of the step, not only when it is traced.
"""

from __future__ import annotations

import abc
import itertools
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _step
from .._runtime import RUNTIME
from .._step import deferrable, torch_leaves_to_jax
from ..errors import ConfigError, StateError

__all__ = ["Metric", "get_all_metrics"]

_COUNTER = itertools.count()
_INT32_MAX = int(np.iinfo(np.int32).max)

MSG_NOT_UPDATED = """\
Trying to compute metric `{name}`, but the metric has not been updated since it was
created or last reset, so it has no value yet.

Wrong:
    accuracy = cstorch.metrics.AccuracyMetric("accuracy")
    print(float(accuracy))                    # no batch has been seen
Right:
    @cstorch.trace
    def eval_step(x, y):
        accuracy(labels=y, predictions=model(x).argmax(-1))
    for x, y in executor:
        eval_step(x, y)
    print(float(accuracy))                    # after the steps that updated it"""

MSG_DTYPE = """\
{owner}.update(dtype={dtype!r}) is not a dtype a metric's value can be cast to.
Pass a numeric or boolean dtype: a torch dtype (torch.float32, torch.bfloat16, as cstorch
code passes it), a numpy / JAX dtype (jnp.float16) or its name ("bfloat16"), or None to
keep float32."""


def get_all_metrics() -> dict[str, Metric]:
    """Every live metric by its (unique) name."""
    return dict(RUNTIME.metrics)


class Metric(abc.ABC):
    """Base class of metrics. ``name`` is made unique (``name.1``, ``name.2``, ...).

    Subclasses implement three pure pieces: ``_initial_state`` (the accumulators),
    ``_update(state, *batch)`` (new accumulators) and ``_compute(state)`` (the value).
    ``update(*batch, dtype=None)`` accumulates one batch; ``dtype`` (keyword only)
    casts the value that ``compute`` returns. ``compute`` before any update raises
    :class:`cerebrax.StateError` on every backend.

    Where torch is loaded, a metric is also a ``torch.nn.Module`` (with no parameters or
    buffers), as cstorch's are: assigned to a torch model's attribute it is a submodule,
    which ``model.modules()`` lists.

    Args:
      name: the metric's name (made unique).
      compute_on_system: cstorch's flag; cerebrax computes every metric inside the
        compiled step, which is ``True`` (``False`` is refused with the fix).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "update" in cls.__dict__:
            cls.update = deferrable(f"{cls.__name__}.update()")(cls.__dict__["update"])

    def __new__(cls, *args: Any, **kwargs: Any) -> Metric:
        # cstorch's metrics are torch modules: one assigned to a module's attribute is a
        # submodule, which model.modules() lists (Model Zoo's evaluation callback finds the
        # model's metrics so). Where torch is loaded, a metric is one too.
        torch = sys.modules.get("torch")
        if torch is None or issubclass(cls, torch.nn.Module):
            return super().__new__(cls)
        self = super().__new__(_as_torch_module(cls, torch.nn.Module))
        torch.nn.Module.__init__(self)
        return self

    def __init__(self, name: str | None = None, compute_on_system: bool = True):
        if compute_on_system is not True:
            raise ConfigError(
                f"{type(self).__name__}(compute_on_system={compute_on_system!r}): cerebrax "
                "computes every metric inside the compiled step, as cstorch does with "
                "compute_on_system=True (required in weight-streaming mode). Fix: drop the "
                "argument, or compute the value on the host in a @cstorch.step_closure."
            )
        if name is not None and not isinstance(name, str):
            raise ConfigError(
                f"{type(self).__name__}: `name` must be a string or None, got {name!r}."
            )
        base = name or type(self).__name__
        unique, i = base, 0
        while unique in RUNTIME.metrics:
            i += 1
            unique = f"{base}.{i}"
        self.name = unique
        RUNTIME.metrics[unique] = self
        self._state = _step.StateRef(self._initial_state(), name=f"metric {unique}")
        self._count = _step.StateRef(jnp.int32(0), name=f"metric {unique} num_updates")
        self._dtype: Any = None

    @abc.abstractmethod
    def _initial_state(self) -> dict[str, jax.Array]:
        """The accumulators of a fresh metric."""

    @abc.abstractmethod
    def _update(
        self, state: dict[str, jax.Array], *args: Any, **kwargs: Any
    ) -> dict[str, jax.Array]:
        """New accumulators after one batch (pure)."""

    @abc.abstractmethod
    def _compute(self, state: dict[str, jax.Array]) -> jax.Array:
        """The metric's value from the accumulators (pure)."""

    @property
    def num_updates(self) -> int | jax.Array:
        """Updates since creation or the last reset, counting every traced step's call.

        Outside a traced step this is a Python int; inside one it is the traced count.
        """
        count = self._count.value
        if _step.active_context() is not None:
            return count
        # Host sync point: waits for the steps that updated the metric.
        return int(jax.device_get(count))

    @deferrable("Metric.update()")
    def update(self, *args: Any, dtype: Any = None, **kwargs: Any) -> None:
        """Accumulates one batch; ``dtype`` casts the value ``compute`` returns (see
        :func:`value_dtype`)."""
        dtype = value_dtype(type(self).__name__, dtype)
        args, kwargs = torch_leaves_to_jax((args, kwargs))  # torch tensors of any dtype
        self._state.value = self._update(dict(self._state.value), *args, **kwargs)
        count = self._count.value
        self._count.value = jnp.where(count < _INT32_MAX, count + 1, count)
        self._dtype = dtype

    def compute(self) -> jax.Array:
        """The metric's value (a traced value inside a step).

        Raises:
          StateError: outside a traced step, when the metric has not been updated since
            it was created or last reset.
        """
        if _step.active_context() is None and self.num_updates == 0:
            raise StateError(MSG_NOT_UPDATED.format(name=self.name))
        return self._value()

    def _value(self) -> jax.Array:
        value = self._compute(self._state.value)
        return value if self._dtype is None else value.astype(self._dtype)

    def reset(self) -> None:
        """Zeroes the accumulators and the update count."""
        self._state.value = self._initial_state()
        self._count.value = jnp.int32(0)
        self._dtype = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _recorded_in_export(self.update, args, kwargs):
            return None  # called in a compiled torch module's forward: see below
        self.update(*args, **kwargs)
        ctx = _step.active_context()
        if ctx is not None and ctx.after_backward:
            return None  # the update runs after the backward pass; read it later
        return self._value()  # just updated: no need to check (or sync on) the count

    def __float__(self) -> float:
        # Host sync point: waits for the steps that updated the metric.
        return float(jax.device_get(self.compute()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


_TORCH_MODULE_CLASSES: dict[type, type] = {}


def _as_torch_module(cls: type[Metric], module: type) -> type:
    """``cls`` as a torch module too: a subclass of ``cls`` and ``torch.nn.Module`` under
    the same name. The metric's own methods come first; a metric has no parameters or
    buffers, so a model's ``state_dict``, ``to`` and ``train`` pass over it."""
    found = _TORCH_MODULE_CLASSES.get(cls)
    if found is None:
        found = type(cls.__name__, (cls, module), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__, "__reduce_ex__": _reduce_to_metric_class,
        })
        _TORCH_MODULE_CLASSES[cls] = found
    return found


def _reduce_to_metric_class(self: Metric, protocol: int) -> Any:
    """Pickles (and copies) a metric that is a torch module as its metric class and its
    metric state; where the copy is made torch is loaded, so it is a torch module again."""
    metric_cls, torch_module = type(self).__bases__
    module_keys = vars(torch_module())
    return _rebuild, (metric_cls, {k: v for k, v in vars(self).items() if k not in module_keys})


def _rebuild(cls: type[Metric], state: dict[str, Any]) -> Metric:
    self = cls.__new__(cls)
    vars(self).update(state)
    return self


def _recorded_in_export(fn: Any, args: tuple, kwargs: dict) -> bool:
    """True where a compiled torch module's ``forward`` is being exported: the call is
    then recorded, and it updates the metric from the graph's values each time the
    compiled model runs (as Model Zoo's models update their metrics in ``forward``)."""
    bridge = sys.modules.get("torch_bridge")  # no torch module exports without it
    return bridge is not None and bridge.record_side_call(fn, args, kwargs)


def value_dtype(owner: str, dtype: Any) -> np.dtype | None:
    """The JAX dtype a metric's value is cast to, for the ``dtype`` given to ``update``.

    cstorch's metrics cast their float32 value with ``result.to(dtype)``, and cstorch
    code passes torch dtypes (Model Zoo: ``dtype=logits.dtype``); a torch dtype stands
    for the JAX dtype of its name, as do numpy / JAX dtypes and dtype names. 64-bit types
    follow JAX's x64 flag (float64 is float32 unless ``jax_enable_x64`` is on), as
    torch_bridge maps them: the value of a float32 computation is the same number.

    Raises:
      ConfigError: ``dtype`` is not a numeric or boolean dtype.
    """
    if dtype is None:
        return None
    # a torch dtype, checked without importing torch (the backend's helpers test it so too)
    is_torch = type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype"
    name = str(dtype).removeprefix("torch.") if is_torch else dtype
    try:
        resolved = jnp.dtype(name)
    except TypeError:
        resolved = None
    if resolved is None or not (
        jax.dtypes.issubdtype(resolved, np.number) or resolved == np.bool_
    ):
        raise ConfigError(MSG_DTYPE.format(owner=owner, dtype=dtype))
    return jax.dtypes.canonicalize_dtype(resolved)


def as_float(x: Any) -> jax.Array:
    return jnp.asarray(x).astype(jnp.float32)


def divide_no_nan(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    """``numerator / denominator``, and 0 wherever the denominator is 0."""
    nonzero = denominator != 0
    return jnp.where(nonzero, numerator / jnp.where(nonzero, denominator, 1), 0)
