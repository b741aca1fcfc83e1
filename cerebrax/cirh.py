"""``cstorch.cirh``: fused operations of the wafer's intermediate representation
(``FusedTopK``, ``FusedTopP``, used for top-k / top-p sampling). cerebrax has no such
operations; calling one is an :class:`~cerebrax.errors.UnsupportedOpError` that gives
the torch equivalent."""

from __future__ import annotations

from typing import Any

from .errors import UnsupportedOpError

__all__ = ["FusedTopK", "FusedTopP"]


def _unsupported(name: str) -> UnsupportedOpError:
    return UnsupportedOpError(
        f"cstorch.cirh.{name} is not supported by cerebrax (it has no wafer IR ops). "
        "Sample with torch ops instead: torch.topk(probs, k), then a cumulative sum of "
        "the sorted probabilities for top-p, then torch.multinomial.")


def FusedTopK(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - cstorch's name
    """Top-k values and indices fused into one tensor: an error in cerebrax."""
    raise _unsupported("FusedTopK")


def FusedTopP(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - cstorch's name
    """Top-p sampling from a FusedTopK result: an error in cerebrax."""
    raise _unsupported("FusedTopP")
