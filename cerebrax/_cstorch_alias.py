"""Running unmodified cstorch code: ``import cerebras.pytorch as cstorch`` gives cerebrax.

``cerebrax run SCRIPT [ARGS...]`` runs a script as ``python SCRIPT ARGS...`` would (the
same ``sys.argv``, ``__name__ == "__main__"``, the script's folder first on ``sys.path``,
its exit status), with ``cerebras.pytorch`` and every submodule of it resolving to
cerebrax's own modules. :func:`enable_cstorch_alias` does the same inside a running
interpreter (a notebook, a test harness).

The alias is the folder ``cerebrax/_alias`` (a ``cerebras`` namespace portion holding
``cerebras/pytorch/__init__.py``; see that file), put first on ``sys.path`` and on
``PYTHONPATH``, so that DataLoader worker processes (spawn, forkserver), which import the
script's modules again, resolve it too. Nothing else turns it on: ``import cerebrax`` does
not. Where a real ``cerebras.pytorch`` (Cerebras' own package) is installed, both refuse
with :class:`~cerebrax.errors.ConfigError` instead of shadowing it.

The same folder holds ``cerebras/appliance/``, cerebrax's minimal stand-in for Cerebras'
appliance package (``cerebras_appliance``, which pins numpy 1.25): only the names Cerebras'
Model Zoo imports from it (logging helpers, error classes, checkpoint storage by path with
local H5 files read and ``s3://`` paths refused, debug args and INI records, byte units, a
telemetry client that sends nothing). It too is importable only where the alias is on, and
where a real ``cerebras.appliance`` is installed elsewhere it loads that package in its
place (see its ``__init__.py``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import pathlib
import runpy
import sys
from collections.abc import Sequence

from ._runtime import RUNTIME
from .errors import ConfigError

__all__ = ["ALIAS_DIR", "alias_enabled", "enable_cstorch_alias", "run_script"]

ALIAS_DIR = pathlib.Path(__file__).resolve().parent / "_alias"

MSG_REAL_CSTORCH = """\
A real cerebras.pytorch is installed ({where}). cerebrax does not shadow it: with it on
the path, `import cerebras.pytorch` gives Cerebras' package, not cerebrax.
Fix, one of:
  - run the script in an environment without cerebras_pytorch (pip uninstall
    cerebras_pytorch, or a fresh venv with cerebrax);
  - change the script's import line to `import cerebrax as cstorch`."""


def _real_cstorch() -> str | None:
    """Where a ``cerebras.pytorch`` other than cerebrax's alias is importable, or None."""
    loaded = sys.modules.get("cerebras.pytorch")
    if loaded is not None:  # the alias gives the module cerebrax itself
        return None if loaded.__name__ == "cerebrax" else str(getattr(loaded, "__file__",
                                                                      loaded))
    alias = str(ALIAS_DIR)
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != alias]
    cerebras = importlib.machinery.PathFinder.find_spec("cerebras", path)
    if cerebras is None or not cerebras.submodule_search_locations:
        return None
    found = importlib.machinery.PathFinder.find_spec(
        "cerebras.pytorch", list(cerebras.submodule_search_locations))
    return None if found is None else str(found.origin or found.submodule_search_locations)


def alias_enabled() -> bool:
    """Whether this process runs cstorch code through the alias (:func:`enable_cstorch_alias`
    was called). Where cstorch and cerebrax differ by default, the alias gives cstorch's
    behaviour: :func:`cerebrax.load` returns torch tensors, as cstorch's does."""
    return RUNTIME.cstorch_alias


def enable_cstorch_alias() -> None:
    """From now on ``import cerebras.pytorch as cstorch`` (and its submodules,
    ``cerebras.pytorch.distributed``, ``cerebras.pytorch.utils.tensorboard``, ...) gives
    cerebrax's modules, in this process and in the processes it starts.

    Raises:
      ConfigError: a real ``cerebras.pytorch`` is installed (named); cerebrax does not
        shadow it.

    Example:
      >>> import cerebrax
      >>> cerebrax.enable_cstorch_alias()  # doctest: +SKIP
      >>> import cerebras.pytorch as cstorch  # doctest: +SKIP
      >>> cstorch is cerebrax  # doctest: +SKIP
      True
    """
    where = _real_cstorch()
    if where is not None:
        raise ConfigError(MSG_REAL_CSTORCH.format(where=where))
    alias = str(ALIAS_DIR)
    if alias not in sys.path:
        sys.path.insert(0, alias)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if alias not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([alias, *parts])
    importlib.invalidate_caches()
    RUNTIME.cstorch_alias = True


def run_script(script: str, args: Sequence[str] = ()) -> int:
    """Runs ``script`` as ``python script *args`` would, with the cstorch alias on; returns
    its exit status (0 when it ends normally; ``SystemExit``'s code otherwise)."""
    path = pathlib.Path(script)
    if not path.is_file():
        raise ConfigError(f"cerebrax run: no such script {script!r}.")
    enable_cstorch_alias()
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    return 0
