"""The errors cerebrax raises.

Every error derives from :class:`CerebraxError`. Each subclass also derives from the
built-in exception a Python user would expect (``ValueError`` for bad arguments,
``RuntimeError`` for misuse at run time), so ``except ValueError`` keeps working.
A message says what went wrong, where (argument, key, module path, value) and how
to fix it.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "CerebraxError",
    "CheckpointError",
    "ConfigError",
    "RecompileError",
    "StateError",
    "SummaryError",
    "TensorReadError",
    "UnsupportedOpError",
]


class CerebraxError(Exception):
    """Base class of every error raised by cerebrax."""


class ConfigError(CerebraxError, ValueError):
    """An invalid configuration value: a backend type, a cluster field, a hyperparameter."""


class BackendError(CerebraxError, RuntimeError):
    """The process-wide backend was misused (a second backend, a mismatched compile, ...)."""


class RecompileError(CerebraxError, RuntimeError):
    """A traced step was called in a way that would need a second compile."""


class TensorReadError(CerebraxError, RuntimeError):
    """A tensor's value was read inside a traced step, outside a step closure."""


class StateError(CerebraxError, RuntimeError):
    """Registered state (parameters, optimizer state, ...) was used in an invalid way."""


class CheckpointError(CerebraxError, RuntimeError):
    """A checkpoint could not be written or read."""


class UnsupportedOpError(CerebraxError, NotImplementedError):
    """A torch operator has no JAX lowering in the torch bridge."""


class SummaryError(CerebraxError, RuntimeError):
    """An event file is missing or damaged, or a summary tag does not exist."""
