"""``cstorch.storage.serializers``: ``use_external_link`` and ``cache_deferred_tensors``,
context managers over how cstorch's checkpoints link and cache their arrays; accepted
and recorded in :data:`settings` (see :mod:`cerebrax.storage`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..errors import ConfigError

__all__ = ["cache_deferred_tensors", "settings", "use_external_link"]

#: The serializer switches :func:`use_external_link` and :func:`cache_deferred_tensors`
#: set; read when a checkpoint is saved.
settings: dict[str, bool] = {"use_external_link": False, "cache_deferred_tensors": True}


@contextlib.contextmanager
def _setting(name: str, value: bool) -> Iterator[None]:
    if not isinstance(value, bool):
        raise ConfigError(f"cstorch.storage.serializers.{name}(value): value is True or "
                          f"False, got {value!r}.")
    before = settings[name]
    settings[name] = value
    try:
        yield
    finally:
        settings[name] = before


def use_external_link(value: bool = True) -> contextlib.AbstractContextManager:
    """Within the block, saves would link to arrays already stored elsewhere instead of
    copying them (cerebrax copies them always; the values saved are the same)."""
    return _setting("use_external_link", value)


def cache_deferred_tensors(value: bool = True) -> contextlib.AbstractContextManager:
    """Within the block, lazily loaded arrays would (not) be kept in memory once read
    (cerebrax reads them on each use; the values are the same)."""
    return _setting("cache_deferred_tensors", value)
