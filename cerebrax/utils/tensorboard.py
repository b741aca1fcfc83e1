"""``cstorch.utils.tensorboard``: summary writer and reader (see :mod:`cerebrax.summaries`)."""

from ..summaries import ScalarEvent as ScalarEvent
from ..summaries import SummaryError as SummaryError
from ..summaries import SummaryReader as SummaryReader
from ..summaries import SummaryWriter as SummaryWriter
from ..summaries import TensorEvent as TensorEvent
from ..summaries import summarize_scalar as summarize_scalar
from ..summaries import summarize_tensor as summarize_tensor
