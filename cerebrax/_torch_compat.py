"""Compatibility fixes for cstorch code written against an older torch, under the alias.

Cerebras' Model Zoo 2.10 pins torch 2.4; cerebrax needs a newer torch. Where Model Zoo's
own code fails only because a torch API changed since, :func:`install` (called by
:func:`cerebrax.enable_cstorch_alias`, so by ``cerebrax run``) applies a narrowly scoped
fix: it only makes a call that the newer torch refuses do what torch 2.4 did, and changes
nothing that works. Outside the alias torch is never touched. Each fix applies when its
torch module is first imported (or at once where it already is).

The fixes (each listed in the docs' Model Zoo page, each tested):

- ``torch.utils._pytree.TreeSpec``: torch 2.4's ``TreeSpec`` was a dataclass whose fields
  were its constructor's arguments, so ``dataclasses.replace(spec, type=...,
  children_specs=...)`` worked (Model Zoo's trainer/validate.py serializes its config so).
  Newer torch keeps the context and children in the fields ``_context`` and
  ``_children``, which ``dataclasses.replace`` passes to a constructor that does not take
  them (``TypeError: ... unexpected keyword argument '_context'``). The fix: the
  constructor also takes them, as the names of ``context`` and ``children_specs``.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["FIXES", "install"]


def _treespec_replace(pytree: Any) -> None:
    """``TreeSpec(type, _context=..., _children=...)``, as ``dataclasses.replace`` calls it."""
    cls = pytree.TreeSpec
    original = cls.__init__
    if getattr(original, "_cerebrax_compat", False):
        return
    fields = getattr(cls, "__dataclass_fields__", {})
    if "_context" not in fields and "_children" not in fields:
        return  # a torch whose fields are the constructor's arguments needs nothing

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if "_context" in kwargs:
            kwargs.setdefault("context", kwargs.pop("_context"))
        if "_children" in kwargs:
            kwargs.setdefault("children_specs", kwargs.pop("_children"))
        original(self, *args, **kwargs)

    __init__._cerebrax_compat = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


# module name -> the fix applied to that module once it is imported
FIXES: dict[str, Callable[[Any], None]] = {
    "torch.utils._pytree": _treespec_replace,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Applies a fix right after its module's own code ran (the loader is wrapped)."""

    _cerebrax_torch_compat = True

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        fix = FIXES.get(fullname)
        if fix is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            fix(module)

        loader.exec_module = exec_module  # this spec's loader is this module's alone
        return spec


def install() -> None:
    """Applies every fix: now to the modules already imported, later to the others."""
    for name, fix in FIXES.items():
        module = sys.modules.get(name)
        if module is not None:
            fix(module)
    if not any(getattr(f, "_cerebrax_torch_compat", False) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
