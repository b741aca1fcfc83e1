"""Mappings between a transformation's state and torch's per-parameter state dicts.

cerebrax keeps one optax state per param group, a NamedTuple with torch's key names and
``count`` for torch's ``step``; ``state_dict()`` and ``load_state_dict()`` speak torch's
layout, one entry per parameter. :class:`AdamLayout` serves the Adam family (per-group
scalars such as NAdam's ``mu_product`` are named, missing buffers are a
:class:`~cerebrax.errors.StateError`); :class:`AdaptiveLayout` serves Adagrad, Adadelta,
ASGD, RMSprop and Rprop (scalar fields repeated per parameter, fields reset to a fill
value, state that may exist before the first step). Also the argument checks these
classes share.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, StateError
from ._optax_optimizer import OptaxOptimizer, stack_like

__all__ = ["AdamLayout", "AdaptiveLayout", "check", "refuse_differentiable"]

_MSG_MISSING = (
    "loaded {opt} state has a step count but no {key!r}; it was saved with other "
    "settings (e.g. amsgrad). Build the optimizer with the settings of the saved one."
)


def check(ok: bool, message: str) -> None:
    """Raises ConfigError with ``message`` unless ``ok`` (torch's argument checks)."""
    if not ok:
        raise ConfigError(message)


def _absent(value: Any) -> bool:
    """Whether a state field is an absent buffer (``()``)."""
    return isinstance(value, tuple) and not value


def refuse_differentiable(name: str, differentiable: bool) -> None:
    """Rejects ``differentiable=True``, which torch accepts and cerebrax cannot honour."""
    if differentiable:
        raise ConfigError(
            f"{name}(differentiable=True) is not supported by cerebrax: the step is compiled "
            "and is not differentiated through; drop the argument"
        )


class AdamLayout(OptaxOptimizer):
    """Maps the group's ``scale_by_torch_*`` state to torch's per-parameter entries.

    ``_state_type`` is the NamedTuple of that state: its ``count`` is torch's ``step``,
    ``_scalar_fields`` are per-group float32 scalars that torch keeps per parameter,
    every other field is a list with one array per parameter (``()`` when unused).
    """

    _state_type: type[NamedTuple]
    _scalar_fields: tuple[str, ...] = ()

    def _find(self, group_state: Any) -> Any:
        return next(p for p in group_state if isinstance(p, self._state_type))

    def _tensor_fields(self) -> list[str]:
        return [
            f for f in self._state_type._fields if f != "count" and f not in self._scalar_fields
        ]

    def state_names_to_sparsify(self) -> list[str]:
        return self._tensor_fields()

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        state = self._find(group_state)
        if int(state.count) == 0:  # torch has no state before the first step
            return [{} for _ in range(n)]
        out = []
        for j in range(n):
            entry: dict[str, Any] = {"step": np.float32(state.count)}
            for name in self._state_type._fields[1:]:
                value = getattr(state, name)
                if name in self._scalar_fields:
                    entry[name] = np.float32(value)
                elif len(value):
                    entry[name] = value[j]
            out.append(entry)
        return out

    def _one_scalar(self, per_param: list[dict[str, Any]], key: str) -> float | None:
        """The value of a per-parameter scalar, which must be the same for all."""
        values = {float(np.asarray(s[key])) for s in per_param if key in s}
        if not values:
            return None
        if len(values) != 1 or any(key not in s for s in per_param):
            raise ConfigError(
                f"loaded {type(self).__name__} state has different {key!r} values per "
                f"parameter ({sorted(values)}); cerebrax keeps one per param group, so load "
                "a state where every parameter of a group took the same steps"
            )
        return values.pop()

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        state = self._find(template)
        step = self._one_scalar(per_param, "step")
        new = self._initial(state) if step is None else self._loaded(state, per_param, step)
        return tuple(new if isinstance(p, self._state_type) else p for p in template)

    def _initial(self, state: Any) -> Any:
        """The state before the first step (what torch's empty entries mean)."""
        fields = {f: jnp.ones((), jnp.float32) for f in self._scalar_fields}
        for f in self._tensor_fields():
            if len(getattr(state, f)):
                fields[f] = [jnp.zeros_like(a) for a in getattr(state, f)]
        return state._replace(count=jnp.zeros((), jnp.int32), **fields)

    def _loaded(self, state: Any, per_param: list[dict[str, Any]], step: float) -> Any:
        fields = {}
        for f in self._scalar_fields:
            value = self._one_scalar(per_param, f)
            if value is None:
                raise StateError(_MSG_MISSING.format(opt=type(self).__name__, key=f))
            fields[f] = jnp.asarray(value, jnp.float32)
        for f in self._tensor_fields():
            if not len(getattr(state, f)):
                continue  # unused by these settings (e.g. max_exp_avg_sq without amsgrad)
            if any(f not in s for s in per_param):
                raise StateError(_MSG_MISSING.format(opt=type(self).__name__, key=f))
            fields[f] = stack_like(getattr(state, f), [s[f] for s in per_param], f)
        return state._replace(count=jnp.asarray(int(step), jnp.int32), **fields)


class AdaptiveLayout(OptaxOptimizer):
    """Maps one state NamedTuple of the chain to torch's per-parameter state dicts.

    Fields holding one array per parameter become per-parameter tensors; scalar
    fields (ASGD's ``eta`` and ``mu``) are repeated for every parameter; ``()`` fields
    are absent buffers.
    """

    _state_type: type[NamedTuple]
    _state_before_first_step = False  # torch creates the state in __init__ (Adagrad)

    def _fill(self, field: str) -> float:
        """The value a field starts at (a state dict with no entries resets to it)."""
        return 0.0

    def _own(self, group_state: Any) -> Any:
        return next(p for p in group_state if isinstance(p, self._state_type))

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        own = self._own(group_state)
        if int(own.count) == 0 and not self._state_before_first_step:
            return [{} for _ in range(n)]
        out = []
        for j in range(n):
            entry = {"step": np.float32(own.count)}
            for field in own._fields[1:]:
                value = getattr(own, field)
                if isinstance(value, (list, tuple)):
                    if not _absent(value):
                        entry[field] = value[j]
                else:
                    entry[field] = np.float32(value)
            out.append(entry)
        return out

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        own = self._own(template)
        name = type(self).__name__
        fields = [f for f in own._fields[1:] if not _absent(getattr(own, f))]
        if not any(per_param):
            new = own._replace(count=jnp.zeros((), jnp.int32), **{
                f: self._reset(f, getattr(own, f)) for f in fields})
        else:
            expected = sorted(["step", *fields])
            for entry in per_param:
                if sorted(entry) != expected:
                    raise ConfigError(
                        f"loaded {name} state has keys {sorted(entry)}, this optimizer keeps "
                        f"{expected} for every parameter; build it with the same settings "
                        "(momentum, centered) as the optimizer that saved the state"
                    )
            values = {f: self._loaded(per_param, f, getattr(own, f)) for f in fields}
            step = self._loaded_scalar(per_param, "step")
            new = own._replace(count=jnp.asarray(int(step), jnp.int32), **values)
        return tuple(new if isinstance(p, self._state_type) else p for p in template)

    def _reset(self, field: str, like: Any) -> Any:
        if isinstance(like, list):
            return [jnp.full_like(x, self._fill(field)) for x in like]
        return jnp.full_like(like, self._fill(field))

    def _loaded(self, per_param: list[dict[str, Any]], field: str, like: Any) -> Any:
        if isinstance(like, list):
            return stack_like(like, [s[field] for s in per_param], field)
        return jnp.asarray(self._loaded_scalar(per_param, field), like.dtype)

    def _loaded_scalar(self, per_param: list[dict[str, Any]], field: str) -> float:
        values = {float(np.asarray(s[field])) for s in per_param}
        if len(values) != 1:
            raise ConfigError(
                f"loaded {type(self).__name__} state has different {field!r} values per "
                f"parameter ({sorted(values)}); cerebrax keeps one per param group"
            )
        return values.pop()
