"""``cstorch.utils.data.data_executor``: the ``DataExecutor`` and ``MbsSetting``, the
type of a micro-batch size setting."""

from __future__ import annotations

from typing import Any, Literal, Union

from ...data import DataExecutor as DataExecutor

__all__ = ["DataExecutor", "MbsSetting"]

MbsSetting = Union[None, int, Literal["auto", "explore"], dict[str, Any]]
"""A micro-batch size setting: an int >= 1, None (no micro-batching), ``"auto"``,
``"explore"``, or a dict of per-batch-size settings (as
``cstorch.backends.csx.performance.micro_batch_size`` takes)."""
