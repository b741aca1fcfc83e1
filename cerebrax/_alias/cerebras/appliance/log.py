"""``cerebras.appliance.log``: cerebrax's minimal stand-in for the logging part of Cerebras'
appliance package, present only under the cstorch alias.

Plain :mod:`logging`, with the logger names Cerebras' package uses: every logger is a child
of ``"cerebras"`` (:data:`logger`), a class decorated with ``@named_class_logger("Name")``
logs to ``"cerebras.Name"``, and the loggers under ``"cerebras.wsc"`` (:data:`wsc_logger`)
hold the log levels a user asks of the Wafer-Scale Cluster's servers. Cerebras' two extra
levels are known by name: ``VERBOSE`` (15) and ``TRACE`` (5).
"""

from __future__ import annotations

import logging
from typing import TypeVar

from cerebrax._runtime import RUNTIME

__all__ = [
    "ClassLogger",
    "collect_wsc_log_settings",
    "get_level_name",
    "logger",
    "named_class_logger",
    "wsc_logger",
]

ROOTNAME = "cerebras"
VERBOSE = logging.INFO - 5
TRACE = logging.DEBUG - 5
_CUSTOM = {"VERBOSE": VERBOSE, "TRACE": TRACE}

logger = logging.getLogger(ROOTNAME)
wsc_logger = logging.getLogger(f"{ROOTNAME}.wsc")

_T = TypeVar("_T", bound=type)


def get_level_name(level: int | str) -> int | str:
    """A level's number from its name (``"info"`` -> 20, case-insensitive, ``"VERBOSE"`` ->
    15, ``"TRACE"`` -> 5, ``"10"`` -> 10), or a number's name (20 -> ``"INFO"``), as
    :func:`logging.getLevelName` with Cerebras' two extra levels.

    Raises:
      ValueError: a name that is no logging level.
    """
    if isinstance(level, str):
        name = level.strip().upper()
        if name.isdigit():
            return int(name)
        if name in _CUSTOM:
            return _CUSTOM[name]
        number = logging.getLevelNamesMapping().get(name)
        if number is None:
            known = sorted({*logging.getLevelNamesMapping(), *_CUSTOM})
            raise ValueError(f"Invalid logging level {level!r}: expected one of "
                             f"{', '.join(known)}, or a number.")
        return number
    for name, number in _CUSTOM.items():
        if level == number:
            return name
    return logging.getLevelName(level)


class ClassLogger:
    """A class whose instances log to ``self.logger`` (a :class:`logging.Logger`).

    :func:`named_class_logger` gives a class its own logger; a class that is not decorated
    logs to the package's root logger ``"cerebras"``.
    """

    logger: logging.Logger = logger


def named_class_logger(cls_or_name: _T | str | None = None):
    """Gives a class the class attribute ``logger``, a :class:`logging.Logger` named
    ``"cerebras.<name>"``.

    ``@named_class_logger("RunSchedule")`` names it ``"cerebras.RunSchedule"`` (a name that
    already starts with ``"cerebras."`` is kept as it is); ``@named_class_logger`` and
    ``@named_class_logger()`` name it ``"cerebras.<module>.<class name>"``.
    """
    if isinstance(cls_or_name, type):
        return _with_logger(cls_or_name, None)
    if cls_or_name is None or isinstance(cls_or_name, str):
        return lambda cls: _with_logger(cls, cls_or_name)
    raise TypeError(f"named_class_logger expects a class, a logger name or nothing, got "
                    f"{type(cls_or_name).__name__}.")


def _with_logger(cls: _T, name: str | None) -> _T:
    if not name:
        name = f"{cls.__module__}.{cls.__name__}"
    if not name.startswith(f"{ROOTNAME}."):
        name = f"{ROOTNAME}.{name}"
    cls.logger = logging.getLogger(name)
    return cls


def collect_wsc_log_settings() -> dict[str, int]:
    """The log levels set on :data:`wsc_logger` and its children, by logger name relative
    to it (``""`` for ``wsc_logger`` itself).

    On Cerebras' cluster these levels go to the cluster's servers. cerebrax has no such
    servers, so they change nothing; where any is set this says so as a warning on
    :data:`logger` (once for each set of levels).
    """
    prefix = wsc_logger.name + "."
    settings = {"": wsc_logger.level} if wsc_logger.level != logging.NOTSET else {}
    for name, found in list(logging.Logger.manager.loggerDict.items()):
        if (name.startswith(prefix) and isinstance(found, logging.Logger)
                and found.level != logging.NOTSET):
            settings[name[len(prefix):]] = found.level
    settings = dict(sorted(settings.items()))
    if settings and settings != RUNTIME.warned.get(_WARNED):
        RUNTIME.warned[_WARNED] = settings
        logger.warning(
            "Wafer-Scale Cluster server log levels %s are set; cerebrax has no cluster "
            "servers, so they have no effect.",
            ", ".join(f"{name or '<all>'}={get_level_name(level)}"
                      for name, level in settings.items()))
    return settings


_WARNED = "cluster server log levels"  # RUNTIME.warned: the levels last warned of
