"""``cstorch.utils.num_kv_groups``: ``groups_annotater``, which tells the wafer's
compiler how many key/value head groups an attention matmul has. Recorded, run unchanged
(see :mod:`cerebrax.core.annotation`)."""

from __future__ import annotations

from collections.abc import Callable

from ..core.annotation import value_annotation
from ..errors import ConfigError

__all__ = ["groups_annotater"]


def groups_annotater(num_groups: int | None) -> Callable[[Callable], Callable]:
    """``groups_annotater(n)(fn)``: ``fn`` run unchanged, annotated with ``n`` key/value
    groups (None: not grouped)."""
    if num_groups is not None and (isinstance(num_groups, bool) or not isinstance(num_groups, int)
                                   or num_groups < 1):
        raise ConfigError(f"groups_annotater({num_groups!r}): the number of key/value "
                          "groups is an int >= 1, or None.")
    return value_annotation("num_kv_groups", num_groups)
