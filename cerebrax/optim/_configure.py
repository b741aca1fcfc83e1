"""``configure_optimizer``: build an optimizer from a configuration dictionary."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ._base import Optimizer

__all__ = ["configure_optimizer"]

# Keys of older configurations and the argument that replaced them.
_LEGACY_KEYS = {
    "weight_decay_rate": "weight_decay",
    "beta1": "betas",
    "beta2": "betas",
    "eps1": "eps",
    "eps2": "eps",
    "eta1": "etas",
    "eta2": "etas",
    "step_size_min": "step_sizes",
    "step_size_max": "step_sizes",
}


def _concrete_subclasses(cls: type) -> dict[str, type]:
    found: dict[str, type] = {}
    for sub in cls.__subclasses__():
        if not inspect.isabstract(sub) and not sub.__name__.startswith("_") and (
            sub.__name__ != "OptaxOptimizer"
        ):
            found[sub.__name__.lower()] = sub
        found.update(_concrete_subclasses(sub))
    return found


def _flatten(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    flat = {k: v for k, v in kwargs.items() if k != "optim_params"}
    nested = kwargs.get("optim_params") or {}
    if not isinstance(nested, Mapping):
        raise ConfigError(f"optim_params must be a dictionary, got {type(nested).__name__}")
    for key, value in nested.items():
        if key in flat:
            raise ConfigError(f"{key!r} is given both directly and inside optim_params")
        flat[key] = value
    return flat


def _learning_rate(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"learning_rate must be a number or a numeric string, got {value!r}. Schedules "
            "are configured with cstorch.optim.configure_lr_scheduler."
        ) from None


def configure_optimizer(optimizer_type: str, params: Any, **kwargs: Any) -> Optimizer:
    """Builds the optimizer named ``optimizer_type`` (case-insensitive) over ``params``.

    ``learning_rate`` (a number or numeric string) becomes ``lr``; a nested
    ``optim_params`` dictionary is flattened; keys of older configurations
    (``weight_decay_rate``, ``beta1``/``beta2``, ``eps1``/``eps2``, ``eta1``/``eta2``,
    ``step_size_min``/``step_size_max``) are rejected with the argument that replaced
    them; keys the optimizer does not take are dropped with a warning.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.configure_optimizer(
      ...     "SGD", compiled.parameters(), learning_rate=0.1, momentum=0.9)
      >>> optimizer
      SGD (
      Parameter Group 0
          dampening: 0
          lr: 0.1
          maximize: False
          momentum: 0.9
          nesterov: False
          weight_decay: 0
      )
    """
    table = _concrete_subclasses(Optimizer)
    cls = table.get(str(optimizer_type).lower())
    if cls is None:
        raise ConfigError(
            f"Invalid optimizer type. Expected one of {sorted(table)}. Got: {optimizer_type}"
        )
    options = _flatten(kwargs)
    legacy = sorted(set(options) & set(_LEGACY_KEYS))
    if legacy:
        key = legacy[0]
        raise ConfigError(
            f"{key!r} is no longer supported by {cls.__name__}: use {_LEGACY_KEYS[key]!r} "
            f"instead (expected: {_LEGACY_KEYS[key]}, actual: {key})."
        )
    if "learning_rate" in options:
        if "lr" in options:
            raise ConfigError("give the learning rate as learning_rate or lr, not both")
        options["lr"] = _learning_rate(options.pop("learning_rate"))
    signature = inspect.signature(cls.__init__)
    accepted = signature.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    if "lr" in accepted and "lr" not in options:
        if accepted["lr"].default is inspect.Parameter.empty:
            options["lr"] = 0.1
    if not takes_any:
        unknown = sorted(k for k in options if k not in accepted or k in ("self", "params"))
        if unknown:
            warnings.warn(
                f"configure_optimizer: {cls.__name__} does not take {unknown}; they are "
                "ignored.", UserWarning, stacklevel=2,
            )
            for key in unknown:
                options.pop(key)
    try:
        return cls(params, **options)
    except TypeError as e:
        raise ConfigError(f"Failed to configure {cls.__name__} optimizer: {e}") from e
