"""Eager argument checks shared by the schedule factories.

Each check returns the value in the form the schedules use (a Python ``float``,
``int`` or list) or raises :class:`~cerebrax.errors.ConfigError` naming the argument,
its value and what it should be.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import ConfigError

INT32_MAX = 2**31 - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def number(name: str, value: Any) -> float:
    """A finite real number."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if not math.isfinite(float(value)):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def positive_number(name: str, value: Any) -> float:
    value = number(name, value)
    if value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}")
    return value


def non_negative_number(name: str, value: Any) -> float:
    value = number(name, value)
    if value < 0:
        raise ConfigError(f"{name} must be >= 0, got {value!r}")
    return value


def positive_int(name: str, value: Any) -> int:
    """An integer in ``[1, 2**31 - 1]`` (the range of the int32 step counter)."""
    if not _is_int(value) or not 1 <= value <= INT32_MAX:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def step_list(name: str, value: Any, *, non_decreasing: bool = False) -> list[int]:
    """A list of step indices (integers in ``[0, 2**31 - 1]``)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(f"{name} must be a list of integer steps, got {value!r}")
    steps = list(value)
    for i, step in enumerate(steps):
        if not _is_int(step) or not 0 <= step <= INT32_MAX:
            raise ConfigError(
                f"{name} must be a list of integer steps >= 0, got {name}[{i}]={step!r}"
            )
    if non_decreasing and any(b < a for a, b in zip(steps, steps[1:])):
        raise ConfigError(f"{name} must be in increasing order, got {steps!r}")
    return [int(s) for s in steps]


def choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, options))}; got {value!r}")
    return value


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return bool(value)
