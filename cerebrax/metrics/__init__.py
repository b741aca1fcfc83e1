"""Evaluation metrics accumulated inside traced steps."""

from ._accuracy import AccuracyMetric as AccuracyMetric
from ._base import Metric as Metric
from ._base import get_all_metrics as get_all_metrics
