"""The cstorch-style ``Optimizer`` base: param groups whose hyperparameters are state.

An optimizer holds ``param_groups`` like ``torch.optim.Optimizer``. Numeric
hyperparameters (``lr``, ``momentum``, ``betas``, ...) live in a registered state slot
as float32 arrays, so a scheduler or a user can change them without a recompile; flags
(``nesterov``, ``amsgrad``, ...) are Python values and part of the graph. Outside a step,
``group["eps"]`` reads back the Python value that was given (``1e-8``, not its float32
rounding), as in torch, for as long as the state still holds that value. Per-parameter
state (``self.state[p]``) is allocated in :meth:`Optimizer.preinitialize` and nowhere
else: the first trace must see the whole graph.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any, Union

import jax
import jax.numpy as jnp
import numpy as np

from .. import _step
from .._step import deferrable, with_jax_gradients
from ..errors import ConfigError, StateError
from ..models import resolve_parameter
from ..schedules._signature import resolve_on_inspection

__all__ = ["Optimizer", "ParamGroup", "ParamsT"]

ParamsT = Union[Iterable[Any], Iterable[dict[str, Any]]]
"""What an optimizer takes as its parameters: parameters, or param-group dicts with a
``"params"`` entry (``torch.optim.optimizer.ParamsT``). Every optimizer's ``params`` is
annotated with this object, which Model Zoo's config builder maps."""

MSG_PARAMS = """\
{where} must hold the parameters of a compiled model, got {got}.
Pass compiled_model.parameters() (or the original torch module's parameters() when the
model is a torch.nn.Module), or a list of param-group dicts {{"params": [...], "lr": ...}}."""


def _is_dynamic(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, (int, float, np.number)):
        return True
    if isinstance(value, (jax.Array, np.ndarray)) and np.ndim(value) == 0:
        return jnp.issubdtype(jnp.result_type(value), jnp.number)
    if isinstance(value, (tuple, list)) and value:
        return all(_is_dynamic(v) and not isinstance(v, (tuple, list)) for v in value)
    return False


def _to_hparam(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return tuple(_to_hparam(v) for v in value)
    if isinstance(value, jax.Array):
        return jnp.asarray(value, jnp.float32)
    return np.asarray(value, np.float32)  # on the host: no program compiled for it


def _to_python(value: Any) -> Any:
    # Host sync point: reading a hyperparameter outside a step waits for the step.
    if isinstance(value, tuple):
        return tuple(float(v) for v in value)
    return float(value)


def _host_given(value: Any) -> Any:
    """The Python value a user assigned, kept to read back exactly; None for arrays."""
    if isinstance(value, (tuple, list)):
        given = [_host_given(v) for v in value]
        return None if any(g is None for g in given) else tuple(given)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        return None  # an array (perhaps traced): read back from the state
    return value.item() if isinstance(value, np.number) else value


def _stored_as(given: Any, array: Any) -> bool:
    """Whether ``array`` is ``given`` rounded to float32, as the state stores it."""
    if isinstance(given, tuple):
        return len(given) == len(array) and all(_stored_as(g, a) for g, a in zip(given, array))
    return bool(np.float32(given) == np.asarray(array))


def _read_back(array: Any, given: Any) -> Any:
    """``group[key]`` outside a step: the Python value given, while the state holds it.

    The state keeps a float32 copy; once a scheduler or a step writes another value,
    that value is read back instead.
    """
    if given is not None and _stored_as(given, array):
        return given
    return _to_python(array)


def _tag_set(tags: Any) -> set:
    if tags is None or isinstance(tags, str):
        return {tags}
    return set(tags)


def _listed(tags: Any) -> Any:
    """A param group's ``tags`` as a list in state dicts (checkpoints hold no sets)."""
    if isinstance(tags, (set, frozenset)):
        return sorted(tags, key=lambda t: (t is not None, str(t)))
    return tags


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


class ParamGroup(MutableMapping):
    """One param group: ``group["params"]`` and its hyperparameters.

    Numeric hyperparameters read as traced arrays inside a traced step and as Python
    values outside one: the value given (to the constructor, in the group dict or by
    assignment) while the state still holds its float32 rounding, else the state's
    value as a float (after a scheduler wrote it, say). Assigning one writes the
    optimizer's state.
    """

    def __init__(self, optimizer: Optimizer, index: int, params: list, static: dict,
                 given: dict):
        self._opt = optimizer
        self._index = index
        self._params = params
        self._static = static
        self._given = given  # the Python values of the dynamic hyperparameters

    def _dynamic(self) -> dict:
        return self._opt._hparams.value[self._index]

    def __getitem__(self, key: str) -> Any:
        if key == "params":
            return self._params
        if key in self._static:
            return self._static[key]
        value = self._dynamic()[key]
        if _step.active_context() is not None:
            return value
        return _read_back(value, self._given.get(key))

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "params":
            raise StateError("The params of a param group are fixed once the optimizer exists.")
        dynamic = self._opt._hparams.value
        if key in dynamic[self._index]:
            groups = [dict(g) for g in dynamic]
            groups[self._index][key] = _to_hparam(value)
            self._opt._hparams.value = groups
            given = _host_given(value)
            if given is not None:
                self._given[key] = given
        elif key in self._static:
            if self._opt._traced and not _same_value(self._static[key], value):
                raise StateError(
                    f"{key!r} of param group {self._index} is part of the compiled step "
                    f"({self._static[key]!r}); it cannot change to {value!r} after the first "
                    "step. Set it when building the optimizer."
                )
            self._static[key] = value
        else:
            raise StateError(
                f"Param group {self._index} has no hyperparameter {key!r}; hyperparameters "
                "are fixed when the optimizer is created (pass it in the group dict)."
            )

    def __delitem__(self, key: str) -> None:
        raise StateError("Hyperparameters cannot be removed from a param group.")

    def __iter__(self) -> Iterator[str]:
        yield "params"
        yield from self._static
        yield from self._opt._hparams.stored[self._index]

    def __len__(self) -> int:
        return 1 + len(self._static) + len(self._opt._hparams.stored[self._index])

    def __repr__(self) -> str:
        return f"ParamGroup({dict(self)!r})"


class _ParamState(MutableMapping):
    """``optimizer.state[p]``: the named state arrays of one parameter."""

    def __init__(self, optimizer: Optimizer, index: int):
        self._opt = optimizer
        self._index = index

    def __getitem__(self, name: str) -> Any:
        return self._opt._state_ref.value[self._index][name]

    def __setitem__(self, name: str, value: Any) -> None:
        current = self._opt._state_ref.value
        if name not in current[self._index]:
            raise StateError(
                f"{type(self._opt).__name__} created optimizer state {name!r} outside "
                "preinitialize(). Allocate every state variable in preinitialize() so the "
                "first trace sees the whole graph."
            )
        new = [dict(s) for s in current]
        new[self._index][name] = value
        self._opt._state_ref.value = new

    def __delitem__(self, name: str) -> None:
        raise StateError("Optimizer state cannot be deleted.")

    def __iter__(self) -> Iterator[str]:
        return iter(self._opt._state_ref.stored[self._index])

    def __len__(self) -> int:
        return len(self._opt._state_ref.stored[self._index])


class _StateView(Mapping):
    """``optimizer.state``: per-parameter state keyed by parameter."""

    def __init__(self, optimizer: Optimizer):
        self._opt = optimizer
        self._collecting: dict[int, dict[str, Any]] | None = {}

    def _index(self, p: Any) -> int:
        index = self._opt._param_index.get(p)
        if index is None:
            raise StateError(f"{p!r} is not a parameter of this optimizer.")
        return index

    def __getitem__(self, p: Any) -> Any:
        index = self._index(p)
        if self._collecting is not None:  # inside preinitialize: plain dicts
            return self._collecting.setdefault(index, {})
        return _ParamState(self._opt, index)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._opt._all_params)

    def __len__(self) -> int:
        return len(self._opt._all_params)


class HookHandle:
    """What ``register_zero_grad_*_hook`` returns: ``remove()`` unregisters the hook."""

    _next_id = 0

    def __init__(self, hooks: dict, hook: Callable):
        HookHandle._next_id += 1
        self._hooks, self._id = hooks, HookHandle._next_id
        hooks[self._id] = hook

    def remove(self) -> None:
        self._hooks.pop(self._id, None)


class Optimizer(abc.ABC):
    """Base class of cerebrax optimizers (cstorch's ``cstorch.optim.Optimizer``).

    Subclasses implement :meth:`preinitialize` (allocate ``self.state[p][name]``),
    :meth:`step` (read ``p.grad``, ``group["lr"]`` and ``self.state[p]``; assign
    ``p.value`` and state) and :meth:`state_names_to_sparsify`. ``step`` may not branch
    in Python on tensor values (use ``jnp.where``); it runs inside the traced step,
    after the gradients exist. :meth:`state_dict` and :meth:`load_state_dict` save and
    restore the state allocated in ``preinitialize`` and the groups' hyperparameters in
    ``torch.optim``'s layout, so a subclass needs no code of its own for checkpoints.

    Args:
      params: parameters (``compiled.parameters()``, or the original torch module's),
        or param-group dicts ``{"params": [...], "lr": ...}``.
      defaults: default hyperparameters of every group.
      enable_global_step: keep a float32 ``state[p]["step"]`` per parameter.
    """

    # Numeric hyperparameters kept as Python values (part of the graph), e.g. Adam's
    # betas, whose ``1 - beta`` torch computes in double precision.
    _static_hyperparameters: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:
            cls.step = deferrable(f"{cls.__name__}.step()")(
                with_jax_gradients(cls.__dict__["step"]))
        if "zero_grad" in cls.__dict__:
            cls.zero_grad = deferrable(f"{cls.__name__}.zero_grad()")(cls.__dict__["zero_grad"])
        resolve_on_inspection(cls)

    def __init__(self, params: ParamsT, defaults: Mapping[str, Any],
                 enable_global_step: bool = False):
        self.defaults = dict(defaults)
        self.generation = _step.current_generation()
        self._traced = False  # set once a traced step has used this optimizer
        groups = self._normalize_groups(params)
        self._all_params: list[_step.Parameter] = [p for g in groups for p in g["params"]]
        self._param_index = {p: i for i, p in enumerate(self._all_params)}
        dynamic, self.param_groups = [], []
        for i, group in enumerate(groups):
            merged = {**self.defaults, **{k: v for k, v in group.items() if k != "params"}}
            dyn = {k: _to_hparam(v) for k, v in merged.items()
                   if _is_dynamic(v) and k not in self._static_hyperparameters}
            static = {k: v for k, v in merged.items() if k not in dyn}
            given = {k: _host_given(merged[k]) for k in dyn}
            dynamic.append(dyn)
            self.param_groups.append(ParamGroup(self, i, group["params"], static, given))
        self._hparams = _step.StateRef(
            dynamic, name=f"{type(self).__name__}.param_groups", skippable=True
        )
        self.enable_global_step = enable_global_step
        self.state = _StateView(self)
        if enable_global_step:
            for p in self._all_params:
                self.state[p]["step"] = jnp.zeros((), jnp.float32)
        self.preinitialize()
        collected = self.state._collecting
        self.state._collecting = None
        self._state_ref = _step.StateRef(
            [collected.get(i, {}) for i in range(len(self._all_params))],
            name=f"{type(self).__name__}.state",
            skippable=True,
        )
        _step.register_optimizer(self)

    def _normalize_groups(self, params: Any) -> list[dict]:
        if isinstance(params, (_step.Parameter, Mapping)) or not isinstance(params, Iterable):
            params = [params]
        items = list(params)
        if not items:
            raise ConfigError("optimizer got an empty parameter list")
        if not all(isinstance(x, Mapping) for x in items):
            items = [{"params": items}]
        groups, seen = [], set()
        for gi, group in enumerate(items):
            if "params" not in group:
                raise ConfigError(f"param group {gi} has no 'params' key")
            raw = group["params"]
            raw = [raw] if isinstance(raw, _step.Parameter) else list(raw)
            resolved = []
            for obj in raw:
                p = resolve_parameter(obj)
                if p is None:
                    raise ConfigError(MSG_PARAMS.format(
                        where=f"param group {gi}", got=f"a {type(obj).__name__}"))
                if p in seen:
                    raise ConfigError(
                        f"some parameters appear in more than one parameter group ({p.name!r})"
                    )
                seen.add(p)
                resolved.append(p)
            groups.append({**group, "params": resolved})
        return groups

    # ---- the subclass API ----------------------------------------------------------
    @abc.abstractmethod
    def preinitialize(self) -> None:
        """Allocates every state variable: ``self.state[p]["name"] = jnp.zeros_like(...)``."""

    @abc.abstractmethod
    def step(self, closure: Any = None) -> Any:
        """Applies one update, inside a traced step, from ``p.grad``."""

    def state_names_to_sparsify(self) -> list[str]:
        """Names of per-parameter state that follows the parameter's sparsity."""
        return []

    @deferrable("optimizer.zero_grad()")
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clears gradients. Inside a traced step, after ``backward``, it takes effect
        in program order (a later ``step()`` then sees no gradient); elsewhere gradients
        do not persist between steps, so there is nothing to clear. The hooks of
        :meth:`register_zero_grad_pre_hook` and :meth:`register_zero_grad_post_hook`
        run around it."""
        args, kwargs = (), {"set_to_none": set_to_none}
        for hook in list(self._zero_grad_hooks("pre").values()):
            changed = hook(self, args, kwargs)
            if changed is not None:
                args, kwargs = changed
        set_to_none = dict(zip(("set_to_none",), args), **kwargs).get("set_to_none", True)
        ctx = _step.active_context()
        if ctx is not None and ctx.has_grads:
            for p in self._all_params:
                g = ctx.grad_or_none(p)
                if g is not None:
                    ctx.set_grad(p, None if set_to_none else jnp.zeros_like(g))
        for hook in list(self._zero_grad_hooks("post").values()):
            hook(self, args, kwargs)

    def _zero_grad_hooks(self, when: str) -> dict[int, Callable]:
        return self.__dict__.setdefault(f"_zero_grad_{when}_hooks", {})

    def register_zero_grad_pre_hook(self, hook: Callable) -> HookHandle:
        """Runs ``hook(optimizer, args, kwargs)`` before every :meth:`zero_grad` call
        (inside a traced step: when the step is traced, as all Python in it); it may
        return new ``(args, kwargs)`` for it (torch's step-hook convention). Returns a
        handle whose ``remove()`` unregisters the hook."""
        return HookHandle(self._zero_grad_hooks("pre"), hook)

    def register_zero_grad_post_hook(self, hook: Callable) -> HookHandle:
        """Runs ``hook(optimizer, args, kwargs)`` after every :meth:`zero_grad`."""
        return HookHandle(self._zero_grad_hooks("post"), hook)

    def visit_state(self, fn: Callable[[Any], Any]) -> None:
        """Calls ``fn`` on every state array (``self.state[p][name]`` of every parameter,
        in parameter order); a result that is not None replaces the array. Inside a
        traced step this rewrites the state the step writes back; outside it, the
        stored state."""
        current = self._state_ref.value
        new = []
        for entry in current:
            entry = dict(entry)
            for name, value in entry.items():
                result = fn(value)
                if result is not None:
                    entry[name] = result
            new.append(entry)
        self._state_ref.value = new

    def apply(self, fn: Callable[[Any], Any]) -> None:
        """``visit_state(fn)`` (cstorch's name for applying a function to the state)."""
        self.visit_state(fn)

    def increment_global_step(self, p: _step.Parameter) -> jax.Array:
        """Adds 1 to ``state[p]["step"]`` (needs ``enable_global_step=True``)."""
        if not self.enable_global_step:
            raise StateError(
                "No global step in the state. Pass enable_global_step=True to the "
                "optimizer's constructor."
            )
        self.state[p]["step"] = self.state[p]["step"] + 1.0
        return self.state[p]["step"]

    # ---- state dicts (torch.optim layout) ---------------------------------------------
    def _group_dicts(self) -> list[dict[str, Any]]:
        """``param_groups`` of a state dict: hyperparameters and parameter indices."""
        groups, offset = [], 0
        for group in self.param_groups:
            info = {k: _listed(v) if k == "tags" else v
                    for k, v in group.items() if k != "params"}
            n = len(group["params"])
            info["params"] = list(range(offset, offset + n))
            groups.append(info)
            offset += n
        return groups

    def state_dict(self) -> dict[str, Any]:
        """The state in ``torch.optim`` layout.

        ``{"state": {i: {name: array}}, "param_groups": [{..., "params": [i, ...]}]}``,
        where ``i`` counts the parameters over the groups in order and ``name`` is each
        state variable allocated in :meth:`preinitialize` (and ``"step"`` with
        ``enable_global_step``). ``cstorch.save`` writes it; :meth:`load_state_dict`
        restores it into an optimizer built the same way.
        """
        # Host sync point: the values of the last step are fetched.
        states = jax.device_get(self._state_ref.value)
        out = {i: {k: np.array(v) for k, v in entry.items()}
               for i, entry in enumerate(states) if entry}
        return {"state": out, "param_groups": self._group_dicts()}

    def _loaded_groups(self, state_dict: Mapping[str, Any]) -> list[tuple[Any, list[int]]]:
        """Pairs each param group with the saved indices of its parameters, checked."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, Mapping) else None
        if groups is None or "state" not in state_dict:
            raise StateError("optimizer state dict needs 'state' and 'param_groups' keys")
        if len(groups) != len(self.param_groups):
            raise StateError(
                f"loaded state dict has {len(groups)} parameter groups, this optimizer has "
                f"{len(self.param_groups)}"
            )
        pairs = []
        for i, (group, saved) in enumerate(zip(self.param_groups, groups)):
            indices = [int(j) for j in saved["params"]]
            if len(indices) != len(group["params"]):
                raise StateError(
                    "loaded state dict contains a parameter group that doesn't match the "
                    f"size of optimizer's group: group {i} has {len(indices)} parameters "
                    f"there, {len(group['params'])} here; build the optimizer over "
                    "the same parameter groups as the one that was saved"
                )
            pairs.append((saved, indices))
        return pairs

    def _load_hyperparameters(self, pairs: list[tuple[Any, list[int]]]) -> None:
        for group, (saved, _) in zip(self.param_groups, pairs):
            for key, value in saved.items():
                if key == "tags" and _tag_set(value) == _tag_set(group.get("tags")):
                    continue  # saved as a list; the group keeps its own collection
                if key != "params" and key in group:
                    group[key] = value

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores a state dict of :meth:`state_dict` (also as read by ``cstorch.load``).

        Every state variable of every parameter must be present with its shape; the
        groups' hyperparameters are restored too.
        """
        pairs = self._loaded_groups(state_dict)
        saved_state = {int(k): v for k, v in state_dict["state"].items()}
        current = self._state_ref.stored
        new = [dict(entry) for entry in current]
        position = 0
        for group, (_, indices) in zip(self.param_groups, pairs):
            for p, saved_index in zip(group["params"], indices):
                entry = saved_state.get(saved_index, {})
                for name, like in current[position].items():
                    if name not in entry:
                        raise StateError(
                            f"loaded optimizer state of parameter {p.name!r} (index "
                            f"{saved_index}) lacks {name!r} (it has {sorted(entry)}); was it "
                            f"saved by another optimizer than {type(self).__name__}?"
                        )
                    new[position][name] = stack_like([like], [entry[name]], name)[0]
                position += 1
        self._state_ref.value = new
        self._load_hyperparameters(pairs)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for key in sorted(k for k in group if k != "params"):
                lines.append(f"    {key}: {group[key]}")
        return "\n".join(lines) + "\n)"


resolve_on_inspection(Optimizer)  # its subclasses: __init_subclass__


def stack_like(template: list, values: list, what: str) -> list:
    """Arrays from ``values`` with the shapes and dtypes of ``template``."""
    out = []
    for t, v in zip(template, values):
        arr = jnp.asarray(np.asarray(v), dtype=t.dtype)
        if arr.shape != t.shape:
            raise StateError(f"optimizer state {what!r} has shape {arr.shape}, expected {t.shape}")
        out.append(arr)
    return out
