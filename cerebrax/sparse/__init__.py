"""``cstorch.sparse``: weight sparsity. cerebrax does not implement sparse training:
the names exist so that code that imports or type-checks them runs, and creating a
sparsity algorithm (or calling :func:`configure`) is an
:class:`~cerebrax.errors.UnsupportedOpError` that says so, never a silently dense run.
"""

from __future__ import annotations

from . import configure as _configure_module  # noqa: F401  (cstorch.sparse.configure.*)
from ._algorithms import Group as Group
from ._algorithms import SparsityAlgorithm as SparsityAlgorithm
from .configure import configure as configure

__all__ = ["Group", "SparsityAlgorithm", "configure"]
