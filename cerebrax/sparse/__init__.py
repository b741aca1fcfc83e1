"""``cstorch.sparse``: weight sparsity. cerebrax does not implement sparse training:
the names exist so that code that imports, type-checks or builds configs from them runs
(the algorithms have cstorch's constructor signatures), and creating a sparsity algorithm
(or calling :func:`configure`) is an :class:`~cerebrax.errors.UnsupportedOpError` that
says so, never a silently dense run.
"""

from __future__ import annotations

from . import configure as _configure_module  # noqa: F401  (cstorch.sparse.configure.*)
from ._algorithms import GMP as GMP
from ._algorithms import SET as SET
from ._algorithms import DynamicSparsityAlgorithm as DynamicSparsityAlgorithm
from ._algorithms import Group as Group
from ._algorithms import RigL as RigL
from ._algorithms import SparsityAlgorithm as SparsityAlgorithm
from ._algorithms import Static as Static
from .configure import configure as configure

__all__ = ["GMP", "SET", "DynamicSparsityAlgorithm", "Group", "RigL", "SparsityAlgorithm",
           "Static", "configure"]
