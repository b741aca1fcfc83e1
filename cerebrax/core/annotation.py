"""``cstorch.core.annotation``: marks on regions of a model for the wafer's compiler.

cstorch attaches these marks (recompute regions, named matmuls, the precision
optimization level of a region, ...) to the operations a decorated function runs, for
its compiler to act on; they never change what the function computes. cerebrax has no
such compiler, so it accepts every annotation with cstorch's signature, checks its
configuration, records it (:func:`recorded_annotations`) and runs the function
unchanged: a model that uses them trains exactly as it does without them.

:func:`pol` and :func:`current_pol` are the one annotation whose value code may read:
``current_pol()`` is the precision optimization level in effect (the innermost
``pol(level=...)`` region being run, else ``cstorch.backends.csx.precision.
optimization_level``), and code such as a rotary embedding may branch on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from .._runtime import RUNTIME
from ..errors import ConfigError

__all__ = ["AnnotationMode", "Annotation", "create_annotation", "current_pol", "pol",
           "recorded_annotations", "value_annotation"]


@dataclasses.dataclass
class _Config:
    """The fields every annotation's configuration has; subclass it (as a dataclass)
    to add the annotation's own fields."""

    enable_fwd: bool
    enable_bwd: bool


class _Attribute(NamedTuple):
    """One mark: its name and its value, as the compiler would receive it."""

    name: str
    value: Any


class AnnotationMode:
    """The annotation building blocks: ``AnnotationMode.Config`` (the dataclass an
    annotation's configuration derives from) and ``AnnotationMode.Attribute`` (a
    ``(name, value)`` mark)."""

    Config = _Config
    Attribute = _Attribute


class Annotation(NamedTuple):
    """One annotation that cerebrax accepted: where, its configuration, and the marks
    it would put on the forward and backward operations (None where disabled)."""

    target: str
    config: Any
    forward: Any
    backward: Any


def recorded_annotations() -> list[Annotation]:
    """Every annotation applied in this process so far, oldest first."""
    return list(RUNTIME.annotations)


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def create_annotation(config_class: type, get_attribute: Callable[[Any, bool], Any],
                      *, enable_fwd: bool = True, enable_bwd: bool = True,
                      **kwargs: Any) -> Callable[[Callable], Callable]:
    """A decorator that annotates the operations of a function (or module) call.

    Args:
      config_class: a dataclass deriving from ``AnnotationMode.Config``.
      get_attribute: ``(config, is_backward) -> AnnotationMode.Attribute``.
      enable_fwd, enable_bwd: mark the forward (backward) operations.
      **kwargs: the other fields of ``config_class``.

    Returns:
      ``decorator(fn)``: ``fn`` itself, run unchanged, with the annotation recorded.

    Raises:
      ConfigError: ``config_class`` is not an ``AnnotationMode.Config`` dataclass, or
        the fields do not match it.
    """
    if not (isinstance(config_class, type) and issubclass(config_class, _Config)
            and dataclasses.is_dataclass(config_class)):
        raise ConfigError(
            f"create_annotation: {config_class!r} must be a dataclass deriving from "
            "cstorch.core.annotation.AnnotationMode.Config.")
    try:
        config = config_class(enable_fwd=enable_fwd, enable_bwd=enable_bwd, **kwargs)
    except TypeError as e:
        raise ConfigError(f"create_annotation({config_class.__name__}, ...): {e}") from None
    forward = get_attribute(config, False) if enable_fwd else None
    backward = get_attribute(config, True) if enable_bwd else None

    def decorator(fn: Callable) -> Callable:
        if not callable(fn):
            raise ConfigError(f"an annotation decorates a callable, got {fn!r}.")
        RUNTIME.annotations.append(Annotation(_name(fn), config, forward, backward))

        @functools.wraps(fn)
        def annotated(*args: Any, **kw: Any) -> Any:
            return fn(*args, **kw)

        return annotated

    return decorator


@dataclasses.dataclass
class _ValueConfig(_Config):
    name: str
    value: Any


def _value_attribute(config: _ValueConfig, is_backward: bool) -> _Attribute:
    return _Attribute(config.name, config.value)


def value_annotation(name: str, value: Any, *, enable_bwd: bool = True
                     ) -> Callable[[Callable], Callable]:
    """A decorator that marks a call's operations with one attribute ``name`` = ``value``
    (the form of cstorch's ``kernel_annotater`` and ``groups_annotater``)."""
    return create_annotation(_ValueConfig, _value_attribute, name=name, value=value,
                             enable_bwd=enable_bwd)


# ---- the precision optimization level --------------------------------------------------
_POL_LEVELS = (0, 1, 2)


@dataclasses.dataclass
class _PolConfig(_Config):
    level: int | None
    bwd_level: int | None


def _pol_attribute(config: _PolConfig, is_backward: bool) -> _Attribute:
    level = config.bwd_level if is_backward else config.level
    return _Attribute("pol", level)


def _check_level(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or value not in _POL_LEVELS):
        raise ConfigError(f"cstorch.pol({name}={value!r}): a level is 0, 1 or 2 (or None "
                          "to keep the level in effect).")


def pol(level: int | None = None, bwd_level: int | None = None) -> Callable[[Callable], Callable]:
    """Runs a function (or module) at a precision optimization level.

    The level steers the wafer compiler's precision choices; cerebrax computes as
    torch does whatever the level, and records it. While the decorated function runs,
    :func:`current_pol` returns ``level`` (when given).

    Example:
      >>> import cerebrax as cstorch, torch
      >>> head = torch.nn.Linear(4, 2)
      >>> cstorch.pol(bwd_level=0)(head)(torch.ones(1, 4)).shape
      torch.Size([1, 2])
    """
    _check_level("level", level)
    _check_level("bwd_level", bwd_level)
    annotate = create_annotation(_PolConfig, _pol_attribute, level=level, bwd_level=bwd_level,
                                 enable_bwd=bwd_level is not None)

    def decorator(fn: Callable) -> Callable:
        annotated = annotate(fn)
        if level is None:
            return annotated

        @functools.wraps(fn)
        def at_level(*args: Any, **kwargs: Any) -> Any:
            RUNTIME.pol_levels.append(level)
            try:
                return annotated(*args, **kwargs)
            finally:
                RUNTIME.pol_levels.pop()

        return at_level

    return decorator


def pol_regions() -> tuple[tuple[int, ...], Callable[[], Any]]:
    """The running ``pol(level=...)`` regions' levels, and a function giving a context
    manager that runs code inside the same regions again (torch_bridge runs a custom
    autograd Function's forward again, outside the region it was applied in, where an
    exported graph runs: see ``torch_bridge.keep_for_functions``)."""
    levels = tuple(RUNTIME.pol_levels)
    return levels, functools.partial(_inside_regions, levels)


@contextlib.contextmanager
def _inside_regions(levels: tuple[int, ...]) -> Iterator[None]:
    saved = RUNTIME.pol_levels[:]
    RUNTIME.pol_levels[:] = levels
    try:
        yield
    finally:
        RUNTIME.pol_levels[:] = saved


def current_pol() -> int:
    """The precision optimization level in effect: the innermost running
    ``pol(level=...)`` region's, else ``cstorch.backends.csx.precision.
    optimization_level`` (1 unless set)."""
    if RUNTIME.pol_levels:
        return RUNTIME.pol_levels[-1]
    from ..backend import backends

    return int(backends.csx.precision.optimization_level)
