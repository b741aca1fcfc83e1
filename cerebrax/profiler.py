"""``cstorch.profiler``: cstorch's profiler of the wafer's execution.

cerebrax runs on JAX, whose profiler (``jax.profiler.trace``, viewed in TensorBoard or
Perfetto) records where a compiled step spends its time; ``schedule`` is accepted as
cstorch takes it, and ``profile`` raises :class:`~cerebrax.errors.UnsupportedOpError`
naming that alternative.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ._filters import check_int
from .errors import UnsupportedOpError

__all__ = ["profile", "schedule"]


@dataclasses.dataclass(frozen=True)
class schedule:  # noqa: N801 - cstorch's name
    """The steps to profile: from ``start_step`` to ``end_step`` (inclusive, 1-based)."""

    start_step: int
    end_step: int

    def __post_init__(self) -> None:
        check_int("schedule(start_step=...)", self.start_step, ge=1)
        check_int("schedule(end_step=...)", self.end_step, ge=self.start_step)


def profile(*args: Any, **kwargs: Any) -> Any:
    """Profiles the wafer's execution: an error in cerebrax (see the module docs)."""
    raise UnsupportedOpError(
        "cstorch.profiler.profile is not supported by cerebrax: there is no wafer to "
        "profile. Profile the compiled step with JAX's profiler instead: "
        "`with jax.profiler.trace('/tmp/trace'): ...` around the steps, then open the "
        "trace in TensorBoard or Perfetto.")
