"""``cstorch.sparse.configure``: building sparsity algorithms from a config, and the
default filter of the parameters sparsity applies to."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedOpError
from ._algorithms import MSG_NO_SPARSITY

__all__ = ["configure", "default_sparse_param_filter"]


def default_sparse_param_filter(name: str, param: Any) -> bool:
    """Which parameters sparsity applies to by default: an error in cerebrax, which has
    no sparsity to apply."""
    raise UnsupportedOpError(MSG_NO_SPARSITY.format(
        what="cstorch.sparse.configure.default_sparse_param_filter"))


def configure(config: Any) -> Any:
    """Builds a sparsity algorithm from ``config``: an error in cerebrax."""
    raise UnsupportedOpError(MSG_NO_SPARSITY.format(what="cstorch.sparse.configure"))
