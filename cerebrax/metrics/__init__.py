"""Evaluation metrics accumulated inside traced steps."""

from ._accuracy import AccuracyMetric as AccuracyMetric
from ._at_k import PrecisionAtKMetric as PrecisionAtKMetric
from ._at_k import RecallAtKMetric as RecallAtKMetric
from ._auc import AUCMetric as AUCMetric
from ._base import Metric as Metric
from ._base import get_all_metrics as get_all_metrics
from ._dice import DiceCoefficientMetric as DiceCoefficientMetric
from ._fbeta import FBetaScoreMetric as FBetaScoreMetric
from ._mean import MeanMetric as MeanMetric
from ._mean_iou import MeanIOUMetric as MeanIOUMetric
from ._mean_per_class_accuracy import MeanPerClassAccuracyMetric as MeanPerClassAccuracyMetric
from ._perplexity import PerplexityMetric as PerplexityMetric
from . import metric as metric
