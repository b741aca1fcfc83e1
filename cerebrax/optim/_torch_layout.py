"""Mappings between a transformation's state and torch's per-parameter state dicts.

cerebrax keeps one optax state per param group, a NamedTuple with torch's key names and
``count`` for torch's ``step``; ``state_dict()`` and ``load_state_dict()`` speak torch's
layout, one entry per parameter. A layout is a mixin of a
:class:`~cerebrax.optim._declared.TorchOptimizer` that names the NamedTuple
(``_state_type``) and its per-group scalars (``_scalar_fields``); every other field but
``count`` holds one array per parameter (``()`` when the settings leave it unused).

- :class:`AdamLayout`: the Adam family; no state before the first step, and a missing
  buffer is a :class:`~cerebrax.errors.StateError`.
- :class:`AdaptiveLayout`: Adagrad, Adadelta, ASGD, RMSprop and Rprop; fields reset to a
  fill value, and state that may exist before the first step.
- :class:`MomentLayout`: Lamb and Lion, whose moments exist from the start and whose
  update does not depend on the step.
- :class:`MomentumLayout`: SGD and Muon, a momentum buffer and no step count.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, StateError
from ._optax_optimizer import OptaxOptimizer, stack_like

__all__ = ["AdamLayout", "AdaptiveLayout", "MomentLayout", "MomentumLayout"]

_MSG_MISSING = (
    "loaded {opt} state has a step count but no {key!r}; it was saved with other "
    "settings (e.g. amsgrad). Build the optimizer with the settings of the saved one."
)


def _absent(value: Any) -> bool:
    """Whether a state field is an absent buffer (``()``)."""
    return isinstance(value, tuple) and not value


class _Layout(OptaxOptimizer):
    """What the layouts share: finding the group's state, its fields, one scalar."""

    _state_type: type[NamedTuple]
    _scalar_fields: tuple[str, ...] = ()

    def _own(self, group_state: Any) -> Any:
        """The group's ``_state_type`` part of its chain's state (None where absent)."""
        return next((p for p in group_state if isinstance(p, self._state_type)), None)

    def _replaced(self, template: Any, new: Any) -> Any:
        return tuple(new if isinstance(p, self._state_type) else p for p in template)

    def _tensor_fields(self) -> list[str]:
        return [
            f for f in self._state_type._fields if f != "count" and f not in self._scalar_fields
        ]

    def state_names_to_sparsify(self) -> list[str]:
        return self._tensor_fields()

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

    def _all_or_none(self, per_param: list[dict[str, Any]], key: str) -> bool:
        """Whether every parameter's entry has ``key``; an error where only some do."""
        present = [s.get(key) is not None for s in per_param]
        if any(present) and not all(present):
            raise ConfigError(
                f"loaded {type(self).__name__} state has {key!r} for only some parameters "
                "of a group; give it for every parameter of the group or for none (save "
                "and load the whole optimizer)"
            )
        return all(present) and bool(present)


class AdamLayout(_Layout):
    """The Adam family: torch has no state before the first step; afterwards every
    parameter's entry has ``step``, the scalars and the buffers the settings use."""

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        state = self._own(group_state)
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

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        state = self._own(template)
        step = self._one_scalar(per_param, "step")
        new = self._initial(state) if step is None else self._loaded(state, per_param, step)
        return self._replaced(template, new)

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


class AdaptiveLayout(_Layout):
    """Adagrad, Adadelta, ASGD, RMSprop and Rprop: the scalar fields (ASGD's ``eta``
    and ``mu``) are repeated for every parameter, and a state dict with no entries
    resets every field to its fill value."""

    _state_before_first_step = False  # torch creates the state in __init__ (Adagrad)

    def _fill(self, field: str) -> float:
        """The value a field starts at (a state dict with no entries resets to it)."""
        return 0.0

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        own = self._own(group_state)
        if int(own.count) == 0 and not self._state_before_first_step:
            return [{} for _ in range(n)]
        out = []
        for j in range(n):
            entry = {"step": np.float32(own.count)}
            for field in own._fields[1:]:
                value = getattr(own, field)
                if field in self._scalar_fields:
                    entry[field] = np.float32(value)
                elif not _absent(value):
                    entry[field] = value[j]
            out.append(entry)
        return out

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        own = self._own(template)
        fields = [f for f in own._fields[1:] if not _absent(getattr(own, f))]
        if not any(per_param):
            new = own._replace(count=jnp.zeros((), jnp.int32), **{
                f: self._reset(f, getattr(own, f)) for f in fields})
        else:
            expected = sorted(["step", *fields])
            for entry in per_param:
                if sorted(entry) != expected:
                    raise ConfigError(
                        f"loaded {type(self).__name__} state has keys {sorted(entry)}, this "
                        f"optimizer keeps {expected} for every parameter; build it with the "
                        "same settings (momentum, centered) as the optimizer that saved the state"
                    )
            values = {f: self._loaded(per_param, f, getattr(own, f)) for f in fields}
            step = self._one_scalar(per_param, "step")
            new = own._replace(count=jnp.asarray(int(step), jnp.int32), **values)
        return self._replaced(template, new)

    def _reset(self, field: str, like: Any) -> Any:
        if isinstance(like, list):
            return [jnp.full_like(x, self._fill(field)) for x in like]
        return jnp.full_like(like, self._fill(field))

    def _loaded(self, per_param: list[dict[str, Any]], field: str, like: Any) -> Any:
        if isinstance(like, list):
            return stack_like(like, [s[field] for s in per_param], field)
        return jnp.asarray(self._one_scalar(per_param, field), like.dtype)


class MomentLayout(_Layout):
    """Lamb and Lion: like cstorch, which allocates the moments when the optimizer is
    built, every parameter has its moments in ``state_dict()`` from the start (zeros
    before the first step). The step count is not part of that layout: a loaded state
    restarts it at 0, which changes nothing in the update."""

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        state = self._own(group_state)
        return [{name: getattr(state, name)[j] for name in self._tensor_fields()}
                for j in range(n)]

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        state = self._own(template)
        fields = {}
        for name in self._tensor_fields():
            like = getattr(state, name)
            if self._all_or_none(per_param, name):
                fields[name] = stack_like(like, [s[name] for s in per_param], name)
            else:
                fields[name] = [jnp.zeros_like(x) for x in like]
        return self._replaced(template, state._replace(count=jnp.zeros((), jnp.int32), **fields))


class MomentumLayout(_Layout):
    """SGD and Muon: ``momentum_buffer`` per parameter once a step has run, nothing
    before (nor for a group without momentum, whose chain has no such state)."""

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        state = self._own(group_state)
        if state is None or int(state.count) == 0:
            return [{} for _ in range(n)]
        return [{"momentum_buffer": b} for b in state.momentum_buffer]

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        state = self._own(template)
        if state is None:
            return template
        if self._all_or_none(per_param, "momentum_buffer"):
            new = state._replace(count=jnp.ones((), jnp.int32), momentum_buffer=stack_like(
                state.momentum_buffer, [s["momentum_buffer"] for s in per_param],
                "momentum_buffer"))
        else:
            new = state._replace(count=jnp.zeros((), jnp.int32),
                                 momentum_buffer=[jnp.zeros_like(b) for b in state.momentum_buffer])
        return self._replaced(template, new)
