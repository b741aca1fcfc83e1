"""``cerebras.appliance.utils.ini``: cerebrax's minimal stand-in for the INI utilities of
Cerebras' appliance package, present only under the cstorch alias.

INI settings tune Cerebras' compiler; they live in a :class:`~.debug_args.DebugArgs`, in
one map per value type: ``ini.bools``, ``ini.ints``, ``ini.floats``, ``ini.strings``.
cerebrax has no such compiler: the settings are recorded, not applied.
"""

from __future__ import annotations

from .debug_args import INI_MAPS, DebugArgs

__all__ = ["set_default_ini", "set_ini"]

Value = bool | int | float | str


def _ini_maps(debug_args: DebugArgs, inis: dict[str, Value]) -> dict[str, dict]:
    """The ``ini`` field of ``debug_args`` (made if absent), once every value is checked."""
    if not isinstance(debug_args, DebugArgs):
        raise TypeError(f"Expected a DebugArgs, got {type(debug_args).__name__}.")
    for name, value in inis.items():
        if type(value) not in INI_MAPS:
            raise TypeError(f"INI {name!r}={value!r} is a {type(value).__name__}; INI "
                            f"values are {', '.join(t.__name__ for t in INI_MAPS)}.")
    ini = debug_args.fields.setdefault("ini", {})
    if not isinstance(ini, dict):
        raise TypeError(f"DebugArgs field 'ini' holds {ini!r}, not INI maps.")
    return ini


def set_ini(debug_args: DebugArgs, **inis: Value) -> None:
    """Sets each INI ``name=value`` in ``debug_args``, in the map of the value's type (a
    value of another type set before under the same name is removed).

    Raises:
      TypeError: a value that is not a bool, int, float or str (nothing is set).
    """
    ini = _ini_maps(debug_args, inis)
    for name, value in inis.items():
        for kind in INI_MAPS.values():
            if isinstance(ini.get(kind), dict):
                ini[kind].pop(name, None)
                if not ini[kind]:
                    del ini[kind]
        ini.setdefault(INI_MAPS[type(value)], {})[name] = value


def set_default_ini(debug_args: DebugArgs, **inis: Value) -> None:
    """Sets each INI ``name=value`` that ``debug_args`` does not set yet (in any map).

    Raises:
      TypeError: a value that is not a bool, int, float or str (nothing is set).
    """
    ini = _ini_maps(debug_args, inis)
    for name, value in inis.items():
        if not any(name in ini.get(kind, {}) for kind in INI_MAPS.values()):
            ini.setdefault(INI_MAPS[type(value)], {})[name] = value
