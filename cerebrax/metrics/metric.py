"""``cstorch.metrics.metric``: the ``Metric`` base class and ``get_all_metrics``."""

from ._base import Metric as Metric
from ._base import get_all_metrics as get_all_metrics

__all__ = ["Metric", "get_all_metrics"]
