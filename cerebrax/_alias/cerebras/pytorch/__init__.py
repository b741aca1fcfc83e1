"""``cerebras.pytorch`` is cerebrax: ``import cerebras.pytorch as cstorch`` works unchanged.

This file is found only where ``cerebrax run`` or :func:`cerebrax.enable_cstorch_alias`
put its folder (``cerebrax/_alias``) on the path: installing or importing cerebrax alone
does not make ``cerebras.pytorch`` importable, and both refuse to run where a real
``cerebras.pytorch`` is installed. ``cerebras`` is a namespace package (PEP 420:
``_alias/cerebras/`` has no ``__init__.py``), so another portion installed elsewhere, such
as Cerebras' Model Zoo (``cerebras.modelzoo``), imports next to this one.

This module never becomes a second copy of cerebrax. Executing it:

1. imports :mod:`cerebrax`;
2. puts :class:`_CerebraxAliasFinder` first on :data:`sys.meta_path`. For a name
   ``cerebras.pytorch.X[.Y...]`` it answers with a spec whose loader imports
   ``cerebrax.X[.Y...]`` (the module already imported, or imports it under its own name)
   and then replaces the placeholder module the import system made with it in
   :data:`sys.modules`. The import system returns what ``sys.modules`` holds after
   ``exec_module`` and binds that object on the parent, so
   ``import cerebras.pytorch.distributed as dist`` gives ``cerebrax.distributed`` itself.
   The finder must come before the path finder: the parent ``cerebras.pytorch`` is
   :mod:`cerebrax`, and the path finder would otherwise load ``cerebrax/X.py`` a second
   time under the name ``cerebras.pytorch.X``;
3. registers ``sys.modules["cerebras.pytorch.X"]`` for every ``cerebrax.X`` already imported
   (again after each import through the alias). An alias found in ``sys.modules`` is never
   loaded, and loading one ends with the import system setting it on its parent:
   ``cerebrax.trace`` and ``cerebrax.backend`` are functions that shadow the submodules of
   the same name, and ``import cerebras.pytorch.trace`` must not turn the function back into
   the module. (A submodule shadowed that way that cerebrax first imports lazily, after this
   file ran, would still be set on its parent by its first import through the alias; cerebrax
   has none today, and tests/test_cerebras_alias.py checks that order for every module.)
4. replaces itself in ``sys.modules`` with :mod:`cerebrax`, so ``import cerebras.pytorch``
   returns (and binds ``cerebras.pytorch`` to) the very module ``cerebrax``.

Nothing of a cerebrax module is changed: its ``__name__``, ``__spec__`` and ``__file__``
stay cerebrax's, so pickles, DataLoader workers (spawn, forkserver) and tracebacks name
``cerebrax.*``. A worker that imports ``cerebras.pytorch.distributed`` runs this file
again in its own process and gets the same aliasing there.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

import cerebrax

_ALIAS = __name__  # "cerebras.pytorch"
_TARGET = cerebrax.__name__  # "cerebrax"


class _CerebraxAliasLoader(importlib.abc.Loader):
    """Loads ``cerebras.pytorch.X`` as the module object ``cerebrax.X``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        return None  # a placeholder; exec_module replaces it in sys.modules

    def exec_module(self, module) -> None:
        sys.modules[module.__name__] = importlib.import_module(self.target)
        _alias_imported_modules()


def _alias_imported_modules() -> None:
    """``sys.modules["cerebras.pytorch.X"] = cerebrax.X`` for every ``cerebrax.X`` imported."""
    prefix = _TARGET + "."
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(prefix):
            sys.modules.setdefault(_ALIAS + name[len(_TARGET):], module)


class _CerebraxAliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``cerebras.pytorch.X...`` as ``cerebrax.X...`` (see the module docstring)."""

    _cerebras_pytorch_alias = True  # how a re-run of this file recognises an installed one

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_ALIAS + "."):
            return None
        real = _TARGET + fullname[len(_ALIAS):]
        module = sys.modules.get(real)
        if module is None:
            try:
                # Imports cerebrax.X's parents (already done: they are our parents) and
                # looks cerebrax.X up without running it.
                if importlib.util.find_spec(real) is None:
                    return None
            except ModuleNotFoundError:
                return None
        return importlib.machinery.ModuleSpec(fullname, _CerebraxAliasLoader(real))


if not any(getattr(finder, "_cerebras_pytorch_alias", False) for finder in sys.meta_path):
    sys.meta_path.insert(0, _CerebraxAliasFinder())

_alias_imported_modules()
sys.modules[__name__] = cerebrax
