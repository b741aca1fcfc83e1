"""The sparsity algorithm classes (see :mod:`cerebrax.sparse`)."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedOpError

__all__ = ["Group", "MSG_NO_SPARSITY", "SparsityAlgorithm"]

MSG_NO_SPARSITY = """\
{what}: cerebrax does not implement weight sparsity; it trains every weight densely, as
torch does. Remove the sparsity setting (Trainer(sparsity=...), the `sparsity:` config
key, or the cstorch.sparse call) to train the dense model."""


class SparsityAlgorithm:
    """The base class of cstorch's sparsity algorithms; creating one is an error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedOpError(MSG_NO_SPARSITY.format(what=f"cstorch.sparse.{type(self).__name__}"))


class Group(SparsityAlgorithm):
    """A group of sparsity algorithms; creating one is an error."""
