"""Running unmodified cstorch code: ``import cerebras.pytorch as cstorch`` gives cerebrax.

``cerebrax run SCRIPT [ARGS...]`` runs a script as ``python SCRIPT ARGS...`` would (the
same ``sys.argv``, ``__name__ == "__main__"``, the script's folder first on ``sys.path``,
its exit status); ``cerebrax run -m MODULE`` as ``python -m MODULE``; ``cerebrax run NAME``
a console script pip installed (``cszoo``) as its command would, with
``cerebras.pytorch`` and every submodule of it resolving to cerebrax's own modules.
:func:`enable_cstorch_alias` does the same inside a running interpreter (a notebook, a
test harness).

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
import importlib.metadata
import importlib.util
import os
import pathlib
import runpy
import shutil
import sys
from collections.abc import Callable, Sequence

from ._runtime import RUNTIME
from .errors import ConfigError

__all__ = ["ALIAS_DIR", "alias_enabled", "enable_cstorch_alias", "run_module", "run_script"]

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
    cerebrax's modules, in this process and in the processes it starts. The narrow fixes
    of :mod:`cerebrax._torch_compat` (code written against torch 2.4) apply from now on.

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
    from . import _torch_compat

    _torch_compat.install()  # Model Zoo's torch-2.4 assumptions (see that module)
    RUNTIME.cstorch_alias = True


MSG_NO_PROGRAM = """\
no such script or command {name!r}. cerebrax run takes a Python file
(`cerebrax run train.py`), a module (`cerebrax run -m package.module`) or a console script
installed on PATH (`cerebrax run cszoo fit params.yaml`)."""

MSG_NOT_PYTHON = """\
{name!r} ({where}) is not a Python program: cerebrax runs Python code only.
Run a Python script, a module (-m) or a console script installed by pip."""


def run_script(script: str, args: Sequence[str] = ()) -> int:
    """Runs ``script`` as ``python script *args`` would, with the cstorch alias on; returns
    its exit status (0 when it ends normally; ``SystemExit``'s code otherwise).

    ``script`` may also name a console script that pip installed (``cszoo``), found among
    the installed packages' entry points or as a Python file on ``PATH``: it runs as its
    command would."""
    path = pathlib.Path(script)
    if path.is_file():
        enable_cstorch_alias()
        sys.argv = [str(path), *args]
        sys.path.insert(0, str(path.resolve().parent))
        # As `python script.py` does, the main module's __file__ is absolute (so that
        # multiprocessing knows it for the script it already runs).
        return _exit_status(lambda: runpy.run_path(os.path.abspath(path),
                                                   run_name="__main__"))
    if os.sep in script or script.endswith(".py"):
        raise ConfigError(MSG_NO_PROGRAM.format(name=script))
    entry = _console_script(script)
    found = shutil.which(script)
    if entry is not None:
        enable_cstorch_alias()
        sys.argv = [found or script, *args]
        return _exit_status(lambda: sys.exit(entry.load()()))
    if found is None:
        raise ConfigError(MSG_NO_PROGRAM.format(name=script))
    if not _is_python(found):
        raise ConfigError(MSG_NOT_PYTHON.format(name=script, where=found))
    enable_cstorch_alias()
    sys.argv = [found, *args]
    return _exit_status(lambda: runpy.run_path(found, run_name="__main__"))


def run_module(module: str, args: Sequence[str] = ()) -> int:
    """Runs ``module`` as ``python -m module *args`` would (the current folder first on
    ``sys.path``, ``sys.argv[0]`` the module's file), with the cstorch alias on; returns its
    exit status."""
    enable_cstorch_alias()
    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ConfigError(f"no module named {module!r}.")
    sys.argv = [module, *args]  # runpy sets argv[0] to the module's file
    return _exit_status(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))


def _console_script(name: str) -> importlib.metadata.EntryPoint | None:
    """The installed ``console_scripts`` entry point called ``name``, or None."""
    found = importlib.metadata.entry_points(group="console_scripts", name=name)
    return next(iter(found), None)


def _is_python(path: str) -> bool:
    """Whether the file at ``path`` is a Python program (a ``#!...python`` first line)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _exit_status(run: Callable[[], object]) -> int:
    """``run()``'s exit status as the interpreter would give it."""
    try:
        run()
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    return 0
