"""``cstorch.backends.csx.{debug, performance, precision}``: global flags set by assignment.

cstorch configures its compiler and appliance with flags such as
``cstorch.backends.csx.performance.micro_batch_size = 4``. cerebrax knows every flag of
cstorch 2.10 by name and refuses any other name (a typo must not pass silently).
A flag with a meaning on cerebrax is applied; the others are accepted, kept and
recorded in the compile report (``{step}.memory.txt`` under the compile directory) and
in :func:`flags_report`:

- ``performance.micro_batch_size``: an int becomes the CSX backend's
  ``ClusterConfig.micro_batch_size`` (micro-batches with rematerialization, see
  :mod:`cerebrax.wse`) unless the ``ClusterConfig`` sets one itself; ``None`` (no
  micro-batching) is cerebrax's default; ``"auto"``, ``"explore"`` and per-batch-size
  dicts ask Cerebras' compiler to choose, and are recorded only.
- every other flag (``precision.optimization_level``, the ``debug`` memory limits and
  INI settings, ``performance.transfer_processes`` ...) tunes Cerebras' compiler,
  appliance or wafer kernels, which cerebrax does not have: recorded only. (The
  precision cerebrax computes in is chosen by ``cstorch.amp.set_half_dtype``; XLA
  chooses the accumulation precision.)

``cstorch.reset()`` restores every flag's default.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

from .._runtime import RUNTIME
from ._debug_args import DebugArgs
from ..errors import ConfigError

__all__ = ["Backends", "FlagGroup", "apply_flags", "backends", "flags_report"]


def _any(value: Any) -> bool:
    return True


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


def _opt_int(value: Any) -> bool:
    return value is None or (type(value) is int and value >= 0)


def _pos_int(value: Any) -> bool:
    return type(value) is int and value >= 1


def _micro_batch(value: Any) -> bool:
    return (value is None or value in ("auto", "explore") or isinstance(value, dict)
            or (type(value) is int and value >= 1))


def _level(value: Any) -> bool:
    return type(value) is int and value in (0, 1, 2)


def _str_list(value: Any) -> bool:
    return value is None or (isinstance(value, (list, tuple))
                             and all(isinstance(v, str) for v in value))


@dataclasses.dataclass(frozen=True)
class _Flag:
    default: Any
    check: Callable[[Any], bool]
    expects: str
    factory: Callable[[], Any] | None = None  # makes the default (a mutable one), kept


_MEMORY = _Flag(None, _opt_int, "an int number of GiB >= 0, or None")
_FLAGS: dict[str, dict[str, _Flag]] = {
    "debug": {
        "retrace_every_iteration": _Flag(False, _bool, "a bool"),
        "lazy_initialization": _Flag(True, _bool, "a bool"),
        "log_initialization": _Flag(False, _bool, "a bool"),
        "drop_data": _Flag(False, _bool, "a bool"),
        # read before any assignment: a fresh DebugArgs, kept, so that MergeFrom on it
        # (Model Zoo's debug_args_path) is recorded
        "debug_args": _Flag(None, _any, "Cerebras debug args", DebugArgs),
        "ini": _Flag(None, _any, "Cerebras INI settings"),
        "fabric_type_blacklist": _Flag(None, _str_list, "a list of strings, or None"),
        "compile_crd_memory_gi": _MEMORY,
        "execute_crd_memory_gi": _MEMORY,
        "wrk_memory_gi": _MEMORY,
        "act_memory_gi": _MEMORY,
        "cmd_memory_gi": _MEMORY,
        "wgt_memory_gi": _MEMORY,
        "chf_memory_gi": _MEMORY,
    },
    "performance": {
        "micro_batch_size": _Flag(
            "auto", _micro_batch,
            "an int >= 1, None, 'auto', 'explore' or a dict of per-batch-size settings"),
        "transfer_processes": _Flag(5, _pos_int, "an int >= 1"),
        "use_speculative_optimizers": _Flag(True, _bool, "a bool"),
        "compress_weights": _Flag(False, _bool, "a bool"),
    },
    "precision": {
        "optimization_level": _Flag(1, _level, "0, 1 or 2"),
    },
    "cluster": {
        "auto_taint": _Flag(False, _bool, "a bool"),
    },
    # cstorch.backends.csx.storage.s3: the credentials profile of S3 checkpoint paths
    "storage.s3": {
        "profile": _Flag(None, lambda v: v is None or isinstance(v, str),
                         "a string (an AWS profile name), or None"),
    },
}


class FlagGroup:
    """One group of flags, ``cstorch.backends.csx.<group>``: read and assign by name."""

    def __init__(self, group: str):
        object.__setattr__(self, "_group", group)

    def _unknown(self, name: str) -> str:
        known = sorted(_FLAGS[self._group])
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return (f"cstorch.backends.csx.{self._group} has no flag {name!r}.{hint} Known "
                f"flags: {', '.join(known)}.")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name not in _FLAGS[self._group]:
            raise AttributeError(self._unknown(name))
        key, flag = f"{self._group}.{name}", _FLAGS[self._group][name]
        if key not in RUNTIME.csx_flags and flag.factory is not None:
            RUNTIME.csx_flags[key] = flag.factory()
        return RUNTIME.csx_flags.get(key, flag.default)

    def __setattr__(self, name: str, value: Any) -> None:
        flag = _FLAGS[self._group].get(name)
        if flag is None:
            raise ConfigError(self._unknown(name))
        if not flag.check(value):
            raise ConfigError(
                f"cstorch.backends.csx.{self._group}.{name} expects {flag.expects}, "
                f"got {value!r}."
            )
        RUNTIME.csx_flags[f"{self._group}.{name}"] = value

    def __dir__(self) -> list[str]:
        return sorted(_FLAGS[self._group])

    def __repr__(self) -> str:
        values = ", ".join(f"{n}={getattr(self, n)!r}" for n in sorted(_FLAGS[self._group]))
        return f"csx.{self._group}({values})"


class _Storage:
    """``cstorch.backends.csx.storage``: its ``s3`` group of flags."""

    def __init__(self) -> None:
        self.s3 = FlagGroup("storage.s3")

    def __repr__(self) -> str:
        return "cstorch.backends.csx.storage(s3)"


class _Csx:
    """``cstorch.backends.csx``: the ``debug``, ``performance``, ``precision``,
    ``cluster`` and ``storage.s3`` groups."""

    def __init__(self) -> None:
        self.debug = FlagGroup("debug")
        self.performance = FlagGroup("performance")
        self.precision = FlagGroup("precision")
        self.cluster = FlagGroup("cluster")
        self.storage = _Storage()

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "storage" and name not in self.__dict__:
            object.__setattr__(self, name, value)
        elif name == "storage":
            raise ConfigError("cstorch.backends.csx.storage holds the s3 group of flags; "
                              "assign its flags, e.g. cstorch.backends.csx.storage.s3.profile "
                              "= ...")
        elif name in _FLAGS and name not in self.__dict__:
            object.__setattr__(self, name, value)  # the groups, set once
        elif name in _FLAGS:
            raise ConfigError(
                f"cstorch.backends.csx.{name} is a group of flags; assign its flags, "
                f"e.g. cstorch.backends.csx.{name}.{sorted(_FLAGS[name])[0]} = ..."
            )
        else:
            raise ConfigError(self._unknown(name))

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(self._unknown(name))

    @staticmethod
    def _unknown(name: str) -> str:
        return (f"cstorch.backends.csx has no {name!r}; its groups of flags are "
                f"{', '.join(sorted(_FLAGS))}.")

    def __repr__(self) -> str:
        return "cstorch.backends.csx(debug, performance, precision, cluster, storage)"


class Backends:
    """``cstorch.backends``: ``csx`` holds the CSX flags."""

    def __init__(self) -> None:
        self.csx = _Csx()


backends = Backends()


def apply_flags(cluster: Any) -> Any:
    """``cluster`` (a ClusterConfig) with the flags that apply to it applied."""
    mbs = RUNTIME.csx_flags.get("performance.micro_batch_size")
    if cluster is None or type(mbs) is not int or cluster.micro_batch_size is not None:
        return cluster
    return dataclasses.replace(cluster, micro_batch_size=mbs)


def _status(key: str, value: Any, backend: Any) -> str:
    if key != "performance.micro_batch_size":
        return "recorded, not applied (no such compiler or appliance in cerebrax)"
    cluster = getattr(backend, "_cluster_config", None)
    if value is None:
        return "applied: no micro-batching (cerebrax's default)"
    if type(value) is not int:
        return "recorded, not applied (cerebrax does not search micro-batch sizes)"
    if cluster is None:
        return ("recorded, not applied: micro-batches apply to a CSX backend's "
                "ClusterConfig, and this run has none")
    if cluster.micro_batch_size is not None and cluster.micro_batch_size != value:
        return (f"recorded, not applied: ClusterConfig(micro_batch_size="
                f"{cluster.micro_batch_size}) sets it")
    return "applied: ClusterConfig.micro_batch_size"


def _untouched(key: str, value: Any) -> bool:
    """Whether ``value`` is a flag's made default, still as made (never reported)."""
    group, name = key.rsplit(".", 1)
    factory = _FLAGS[group][name].factory
    return factory is not None and value == factory()


def flags_report(backend: Any = None) -> list[str]:
    """One line per flag set (and per appliance field of the ClusterConfig set): its
    value and whether cerebrax applies it."""
    lines = [f"csx.{key}: {value!r} ({_status(key, value, backend)})"
             for key, value in sorted(RUNTIME.csx_flags.items()) if not _untouched(key, value)]
    cluster = getattr(backend, "_cluster_config", None)
    if cluster is not None:
        lines += [f"cluster_config.{name}: {value!r} (recorded, not applied: appliance "
                  "only)" for name, value in sorted(cluster.appliance_settings().items())]
    return lines
