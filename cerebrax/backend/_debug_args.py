"""``DebugArgs``: the value of ``cstorch.backends.csx.debug.debug_args``.

Cerebras' debug args are a protobuf message of settings for its compiler and cluster
servers (``debug_mgr.labels``, ``ini.bools``, ...). cerebrax has neither, so a
:class:`DebugArgs` records what is set, as nested fields, for the flags report
(recorded, not applied). ``cerebras.appliance.utils.debug_args`` (the stand-in under
the cstorch alias) reads and writes them as files.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["DebugArgs"]

_SCALARS = (bool, int, float, str)


def _checked(value: Any, where: str) -> Any:
    """``value`` as a field value: a scalar, a dict of field values, or a list of either."""
    if isinstance(value, Mapping):
        return {_checked_key(k, where): _checked(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not any(isinstance(v, (list, tuple))
                                                   for v in value):
        return [_checked(v, where) for v in value]
    if isinstance(value, _SCALARS):
        return value
    raise TypeError(f"DebugArgs field {where!r}: {value!r} is a {type(value).__name__}; "
                    "fields hold bool, int, float or str values, nested fields, or flat "
                    "lists of them.")


def _checked_key(key: Any, where: str) -> Any:
    if isinstance(key, (str, int)) and not isinstance(key, bool):
        return key
    raise TypeError(f"DebugArgs field {where!r}: key {key!r} is not a str or int.")


def _merge(into: dict, fields: dict, *, extend: bool) -> None:
    """Protobuf merge: nested fields merge, lists extend (or are replaced), scalars replace."""
    for name, value in fields.items():
        old = into.get(name)
        if isinstance(value, dict) and isinstance(old, dict):
            _merge(old, value, extend=extend)
        elif extend and isinstance(value, list) and isinstance(old, list):
            old.extend(value)
        else:
            into[name] = value


class DebugArgs:
    """A record of Cerebras debug args: nested fields, set by name.

    Args:
      fields: nested fields to start with (``{"debug_mgr": {"labels": {"a": "b"}}}``).

    Example:
      >>> from cerebrax.backend import DebugArgs
      >>> args = DebugArgs({"ini": {"bools": {"ws_cv_auto_inis": True}}})
      >>> args.MergeFrom(DebugArgs({"debug_mgr": {"labels": {"team": "ml"}}}))
      >>> args.to_dict()
      {'ini': {'bools': {'ws_cv_auto_inis': True}}, 'debug_mgr': {'labels': {'team': 'ml'}}}
    """

    def __init__(self, fields: Mapping[str, Any] | None = None) -> None:
        self._recorded: dict[str, Any] = {}
        if fields:
            _merge(self._recorded, _checked(fields, "DebugArgs"), extend=False)

    @property
    def fields(self) -> dict[str, Any]:
        """The recorded fields themselves (not a copy): nested dicts, lists and scalars."""
        return self._recorded

    def merge(self, fields: Mapping[str, Any], *, extend: bool = False) -> None:
        """Merges nested ``fields`` in (checked): nested fields merge, lists are extended
        (``extend``) or replaced, other values replaced."""
        _merge(self._recorded, _checked(dict(fields), "DebugArgs"), extend=extend)

    @staticmethod
    def check(value: Any, where: str) -> Any:
        """``value`` as a field value (a scalar, nested fields, a flat list), or
        ``TypeError`` naming the field ``where``."""
        return _checked(value, where)

    def MergeFrom(self, other: DebugArgs) -> None:  # noqa: N802 (protobuf's name)
        """Merges ``other``'s fields into these, as protobuf does: nested fields merge,
        lists are extended, other values replaced.

        Raises:
          TypeError: ``other`` is not a :class:`DebugArgs`.
        """
        if not isinstance(other, DebugArgs):
            raise TypeError(f"DebugArgs.MergeFrom expects a DebugArgs, got "
                            f"{type(other).__name__}.")
        _merge(self._recorded, copy.deepcopy(other._recorded), extend=True)

    def to_dict(self) -> dict[str, Any]:
        """A copy of the fields, as nested dicts."""
        return copy.deepcopy(self._recorded)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DebugArgs) and self._recorded == other._recorded

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"DebugArgs({self._recorded!r})"


