"""``configure_lr_scheduler``: build a scheduler from a config's ``learning_rate`` value.

Accepted forms (as in cstorch):

- a number or numeric string: ``ConstantLR`` at that rate;
- a dict ``{"scheduler": NAME, **arguments}``: that scheduler;
- a list of such dicts: a ``SequentialLR`` whose milestones are the running sum of the
  ``total_iters`` of all but the last, or a ``ChainedScheduler`` when the dicts say
  ``main_scheduler: "chained"``.

``NAME`` is matched case-insensitively, with or without the ``LR`` suffix (``"linear"``,
``"CosineDecayLR"``). Arguments are the constructor's parameter names exactly; the
names of older releases are rejected with the current name.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ._base import LRScheduler
from ._composite import ChainedScheduler, ScalePerParamLR, SequentialLR
from ._signature import as_written

__all__ = ["configure_lr_scheduler"]

# Argument names of older releases -> the name the constructors take now.
_LEGACY_KEYS = {
    "steps": "total_iters",
    "decay_steps": "total_iters",
    "learning_rate": "initial_learning_rate",
    "base_lr": "initial_learning_rate",
    "values": "learning_rates",
    "boundaries": "milestones",
}
_ALIASES = {"chainedlr": ChainedScheduler}
_MAIN_SCHEDULERS = {"chained": "chained", "chainedlr": "chained",
                    "chainedscheduler": "chained", "sequential": "sequential",
                    "sequentiallr": "sequential"}

MSG_FORM = """\
learning_rate must be a number, a dict or a list of dicts, got {got}. For example:
    learning_rate: 0.001
    learning_rate: {{scheduler: CosineDecay, initial_learning_rate: 0.001,
                    end_learning_rate: 0.0, total_iters: 1000}}
    learning_rate:
      - {{scheduler: Linear, initial_learning_rate: 0.0, end_learning_rate: 0.001,
         total_iters: 100}}
      - {{scheduler: CosineDecay, initial_learning_rate: 0.001, end_learning_rate: 0.0,
         total_iters: 900}}"""


def configure_lr_scheduler(optimizer: Any, learning_rate: Any,
                           adjust_learning_rate: Any = None) -> LRScheduler | None:
    """Builds the learning-rate scheduler a config describes.

    Args:
      optimizer: the cerebrax optimizer to schedule.
      learning_rate: a number or numeric string (a constant rate), a dict with a
        ``"scheduler"`` name and that scheduler's arguments, or a list of such dicts
        (run in sequence, or multiplied with ``main_scheduler: "chained"``). A falsy
        value (``None``, ``0``, ``""``, ``[]``) means no scheduler.
      adjust_learning_rate: cstorch's per-layer-type scaling factors (muP); when given,
        the scheduler is wrapped in ``ScalePerParamLR``, which scales each param group's
        rate by its ``"adjust_learning_rate"`` entry. Not with a chained scheduler.

    Returns:
      The scheduler, or ``None`` for a falsy ``learning_rate``.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.SGD(compiled.parameters(), lr=0.1)
      >>> scheduler = cstorch.optim.configure_lr_scheduler(optimizer, [
      ...     {"scheduler": "Linear", "initial_learning_rate": 0.0,
      ...      "end_learning_rate": 0.1, "total_iters": 10},
      ...     {"scheduler": "CosineDecay", "initial_learning_rate": 0.1,
      ...      "end_learning_rate": 0.0, "total_iters": 90}])
      >>> type(scheduler).__name__
      'SequentialLR'
    """
    if not learning_rate:
        return None
    specs = _as_specs(learning_rate)
    main = _main_scheduler(specs)
    if adjust_learning_rate and main == "chained":
        raise ConfigError(
            "main_scheduler 'chained' is not supported with adjust_learning_rate (per-layer "
            "learning-rate scaling); use a sequential schedule or drop adjust_learning_rate"
        )
    scheduler = _combine(optimizer, [_build(optimizer, spec, f"learning_rate[{i}]")
                                     for i, spec in enumerate(specs)], main, "learning_rate")
    return ScalePerParamLR(optimizer, scheduler) if adjust_learning_rate else scheduler


def _as_specs(learning_rate: Any) -> list[dict[str, Any]]:
    if isinstance(learning_rate, bool):
        raise ConfigError(MSG_FORM.format(got=repr(learning_rate)))
    if isinstance(learning_rate, (int, float)):
        return [{"scheduler": "constant", "learning_rate": float(learning_rate)}]
    if isinstance(learning_rate, str):
        try:
            return [{"scheduler": "constant", "learning_rate": float(learning_rate)}]
        except ValueError:
            raise ConfigError(MSG_FORM.format(got=f"the string {learning_rate!r}")) from None
    items = [learning_rate] if isinstance(learning_rate, Mapping) else learning_rate
    if not isinstance(items, (list, tuple)):
        raise ConfigError(MSG_FORM.format(got=f"a {type(learning_rate).__name__}"))
    return [_normalize(item, f"learning_rate[{i}]") for i, item in enumerate(items)]


def _normalize(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where} must be a dict describing a scheduler, got {item!r}")
    spec = dict(item)
    if "scheduler" not in spec and len(spec) == 1:
        # The nested form {NAME: {arguments}}.
        (name, arguments), = spec.items()
        if isinstance(arguments, Mapping):
            spec = {"scheduler": name, **arguments}
    if "scheduler" not in spec:
        raise ConfigError(
            f"{where} has no 'scheduler' key naming the scheduler, got keys "
            f"{sorted(spec)}. Add e.g. scheduler: CosineDecay."
        )
    return spec


def _main_scheduler(specs: list[dict[str, Any]]) -> str:
    values = {}
    for i, spec in enumerate(specs):
        if "main_scheduler" not in spec:
            continue
        value = spec.pop("main_scheduler")
        kind = _MAIN_SCHEDULERS.get(str(value).lower())
        if kind is None:
            raise ConfigError(
                f"learning_rate[{i}] has main_scheduler={value!r}; expected 'chained' or "
                "'sequential'"
            )
        values[i] = kind
    if len(set(values.values())) > 1:
        raise ConfigError(
            f"main_scheduler values conflict: {values}; give the same value in every "
            "scheduler dict (or in one)"
        )
    return next(iter(values.values()), "sequential")


def _combine(optimizer: Any, schedulers: list[LRScheduler], main: str,
             where: str) -> LRScheduler:
    if len(schedulers) == 1:
        return schedulers[0]
    if main == "chained":
        return ChainedScheduler(schedulers)
    return SequentialLR(optimizer, schedulers, _milestones(schedulers, where))


def _milestones(schedulers: list[LRScheduler], where: str) -> list[int]:
    for i, scheduler in enumerate(schedulers[:-1]):
        if scheduler.total_iters is None:
            raise ConfigError(
                f"{where}[{i}] ({type(scheduler).__name__}) has no total_iters, so the next "
                "scheduler's start is unknown. Give it total_iters, or make it the last one."
            )
    return list(itertools.accumulate(s.total_iters for s in schedulers[:-1]))


def _scheduler_classes() -> dict[str, type[LRScheduler]]:
    """Public LRScheduler subclasses by lower-cased name; cerebrax's own win a clash.

    Only learning-rate schedulers (not the weight-decay ones) and not ``ScalePerParamLR``,
    which ``adjust_learning_rate`` applies.
    """
    found, pending = [], [LRScheduler]
    while pending:
        for sub in pending.pop().__subclasses__():
            if (not sub.__name__.startswith("_") and not inspect.isabstract(sub)
                    and sub.param_group_key == "lr" and not issubclass(sub, ScalePerParamLR)):
                found.append(sub)
            pending.append(sub)
    found.sort(key=lambda cls: cls.__module__.startswith(__package__))
    return {**{cls.__name__.lower(): cls for cls in found}, **_ALIASES}


def _resolve(name: Any, where: str) -> type[LRScheduler]:
    classes = _scheduler_classes()
    key = str(name).lower()
    for candidate in (key, key + "lr"):
        if candidate in classes:
            return classes[candidate]
    names = sorted({cls.__name__ for cls in classes.values()})
    raise ConfigError(
        f"Invalid lr_scheduler type {name!r} in {where}. Expected one of {names} "
        "(case-insensitive, the 'LR' suffix optional)."
    )


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    params = as_written(cls.__init__).parameters  # evaluates no annotation: imports no torch
    return {n: p for n, p in params.items() if n not in ("self", "optimizer")
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _check_keys(cls: type, arguments: dict[str, Any], where: str,
                optional: tuple[str, ...] = ()) -> None:
    params = _parameters(cls)
    unknown = []
    for key in arguments:
        if key in params:
            continue
        replacement = _LEGACY_KEYS.get(key)
        if replacement not in params:
            replacement = next((p for p in params if p.lower() == str(key).lower()), None)
        if replacement is not None:
            raise ConfigError(
                f"{where}: the argument {key!r} of {cls.__name__} is no longer supported; "
                f"rename it to {replacement!r} (expected: {replacement}, actual: {key})"
            )
        unknown.append(key)
    if unknown:
        raise ConfigError(
            f"{where}: unknown argument(s) {unknown} for {cls.__name__}; its arguments "
            f"are {list(params)}"
        )
    missing = [n for n, p in params.items()
               if p.default is p.empty and n not in arguments and n not in optional]
    if missing:
        raise ConfigError(f"{where}: {cls.__name__} needs the argument(s) {missing}")


def _build(optimizer: Any, spec: dict[str, Any], where: str) -> LRScheduler:
    arguments = dict(spec)
    cls = _resolve(arguments.pop("scheduler"), where)
    if cls in (SequentialLR, ChainedScheduler):
        return _build_composite(optimizer, cls, arguments, where)
    _check_keys(cls, arguments, where)
    return cls(optimizer, **arguments)


def _build_composite(optimizer: Any, cls: type, arguments: dict[str, Any],
                     where: str) -> LRScheduler:
    _check_keys(cls, arguments, where, optional=("milestones",))
    items = arguments.pop("schedulers")
    if not isinstance(items, (list, tuple)) or not items:
        raise ConfigError(f"{where}.schedulers must be a non-empty list of dicts, got {items!r}")
    members = [_build(optimizer, _normalize(item, f"{where}.schedulers[{i}]"),
                      f"{where}.schedulers[{i}]") for i, item in enumerate(items)]
    if cls is ChainedScheduler:
        return ChainedScheduler(members)
    if "milestones" not in arguments:
        return SequentialLR(optimizer, members, _milestones(members, f"{where}.schedulers"),
                            **arguments)
    milestones = arguments.pop("milestones")
    if all(m.total_iters is not None for m in members[:-1]):
        expected = _milestones(members, f"{where}.schedulers")
        if list(milestones) != expected:
            raise ConfigError(
                f"{where}.milestones={list(milestones)} do not match the running sum of the "
                f"schedulers' total_iters, {expected}; drop milestones to use the latter"
            )
    return SequentialLR(optimizer, members, milestones, **arguments)
