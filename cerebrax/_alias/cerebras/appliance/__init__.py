"""``cerebras.appliance``: cerebrax's minimal stand-in for Cerebras' appliance package,
present only under the cstorch alias.

Cerebras' Model Zoo (``cerebras.modelzoo``) imports a few names from ``cerebras.appliance``,
Cerebras' client for its Wafer-Scale Cluster, on the import chain of its models (through
``cerebras.modelzoo.trainer``). The real package (``cerebras_appliance`` on PyPI) pins
numpy 1.25, which cannot share an environment with cerebrax's numpy 2, so cerebrax ships
this stand-in next to ``cerebras/pytorch`` in ``cerebrax/_alias``. It holds only the names
Model Zoo uses, with the meaning they have on one machine with no cluster:

- :mod:`.log`: ``ClassLogger``, ``named_class_logger``, ``get_level_name``, ``wsc_logger``,
  ``collect_wsc_log_settings`` (plain :mod:`logging`), and ``logger`` (here too);
- :mod:`.errors`: the appliance's exception classes Model Zoo raises and catches;
- :mod:`.environment`: ``appliance_environ``;
- :mod:`.cluster.client`: ``TelemetryClient``, which sends nothing (there is no server);
- :mod:`.storage`: checkpoint paths: local H5 files, and ``s3://`` paths refused clearly;
- :mod:`.utils`: ``debug_args``, ``ini``, ``classes``, ``units`` and ``file`` helpers.

Only ``cerebrax run`` and :func:`cerebrax.enable_cstorch_alias` put its folder on the path:
``import cerebrax`` alone does not make ``cerebras.appliance`` importable.

A real ``cerebras.appliance`` installed elsewhere (``cerebras_appliance`` without
``cerebras_pytorch``) is never shadowed: executing this file first looks for another
``cerebras.appliance`` on :data:`sys.path`, outside cerebrax's alias folders, and where
there is one it loads that package in this one's place (``sys.modules`` then holds the real
package, so ``import cerebras.appliance.log`` gives the real submodule too).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

# cerebrax/_alias/cerebras/appliance/__init__.py -> cerebrax/_alias
_ALIAS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def _is_alias_folder(entry: str) -> bool:
    """Whether a ``sys.path`` entry is cerebrax's alias folder (this one, or another copy's:
    its stand-in would look for the real package again and find this one)."""
    path = os.path.realpath(entry or os.curdir)
    return path == _ALIAS_ROOT or (os.path.basename(path) == "_alias" and
                                   os.path.basename(os.path.dirname(path)) == "cerebrax")


def _real_appliance() -> importlib.machinery.ModuleSpec | None:
    """The spec of a ``cerebras.appliance`` found on the path outside the alias, or None."""
    path = [p for p in sys.path if isinstance(p, str) and not _is_alias_folder(p)]
    cerebras = importlib.machinery.PathFinder.find_spec("cerebras", path)
    if cerebras is None or not cerebras.submodule_search_locations:
        return None
    return importlib.machinery.PathFinder.find_spec(
        __name__, list(cerebras.submodule_search_locations))


_real = _real_appliance()
if _real is not None:
    # The import system returns whatever sys.modules holds under our name once this file
    # has run, and binds that on the parent: the real package, not this stand-in.
    _module = importlib.util.module_from_spec(_real)
    sys.modules[__name__] = _module
    try:
        _real.loader.exec_module(_module)
    except BaseException as error:
        error.add_note(
            f"cerebras.appliance at {_real.origin or _real.submodule_search_locations} is "
            "Cerebras' own package, found on the path; cerebrax's stand-in defers to it. "
            "Uninstall cerebras_appliance to use cerebrax's stand-in instead.")
        raise
else:
    from .log import logger

    __all__ = ["logger"]
