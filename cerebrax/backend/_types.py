"""``BackendType``, ``current_backend_impl`` and ``get_backend_args`` of
``cstorch.backend``."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ._backend import _ALLOWED, Backend, BackendType, current_backend

__all__ = ["BackendType", "current_backend_impl", "get_backend_args"]


def current_backend_impl(raise_exception: bool = True) -> Backend | None:
    """The active backend object (as :func:`current_backend`)."""
    return current_backend(raise_exception=raise_exception)


def get_backend_args(backend_type: BackendType | str) -> dict[str, Any]:
    """The keyword arguments ``cstorch.backend(backend_type, ...)`` takes, each with its
    default (None: the backend's own).

    Example:
      >>> from cerebrax.backend import get_backend_args
      >>> sorted(get_backend_args("cpu"))
      ['allow_recompile', 'artifact_dir', 'cluster_config']
    """
    kind = backend_type if isinstance(backend_type, BackendType) else BackendType.from_str(
        backend_type)
    return {name: None for name in sorted(_ALLOWED[kind.value])}
