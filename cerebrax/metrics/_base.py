"""``Metric``: accumulators in registered state, updated inside traced steps.

A metric follows reset / update / compute with explicit state: ``_initial_state``
gives the accumulators, ``_update`` is a pure function from the old accumulators and a
batch to the new ones, ``_compute`` a pure function from the accumulators to the value.
Inside a traced step ``metric(...)`` updates the accumulators in the graph; after the
steps ``float(metric)`` reads the final value.
"""

from __future__ import annotations

import abc
import itertools
import weakref
from typing import Any

import jax
import jax.numpy as jnp

from .. import _state
from ..trace import deferrable

__all__ = ["Metric", "get_all_metrics"]

_METRICS: weakref.WeakValueDictionary[str, Metric] = weakref.WeakValueDictionary()
_COUNTER = itertools.count()


def get_all_metrics() -> dict[str, Metric]:
    """Every live metric by its (unique) name."""
    return dict(_METRICS)


class Metric(abc.ABC):
    """Base class of metrics. ``name`` is made unique (``name.1``, ``name.2``, ...)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "update" in cls.__dict__:
            cls.update = deferrable(f"{cls.__name__}.update()")(cls.__dict__["update"])

    def __init__(self, name: str | None = None):
        base = name or type(self).__name__
        unique, i = base, 0
        while unique in _METRICS:
            i += 1
            unique = f"{base}.{i}"
        self.name = unique
        _METRICS[unique] = self
        self._state = _state.StateRef(self._initial_state(), name=f"metric {unique}")
        self.num_updates = 0

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

    @deferrable("Metric.update()")
    def update(self, *args: Any, **kwargs: Any) -> None:
        """Accumulates one batch."""
        self._state.value = self._update(dict(self._state.value), *args, **kwargs)
        if _state.active_context() is None:
            self.num_updates += 1

    def compute(self) -> jax.Array:
        """The metric's value (a traced value inside a step)."""
        return self._compute(self._state.value)

    def reset(self) -> None:
        """Zeroes the accumulators."""
        self._state.value = self._initial_state()
        self.num_updates = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.update(*args, **kwargs)
        ctx = _state.active_context()
        if ctx is not None and ctx.after_backward:
            return None  # the update runs after the backward pass; read it later
        return self.compute()

    def __float__(self) -> float:
        # Host sync point: waits for the steps that updated the metric.
        return float(jax.device_get(self.compute()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def as_float(x: Any) -> jax.Array:
    return jnp.asarray(x).astype(jnp.float32)
