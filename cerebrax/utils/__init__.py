"""``cstorch.utils``: data utilities in ``cstorch.utils.data``, TensorBoard summaries in
``cstorch.utils.tensorboard``, a data loader benchmark in ``cstorch.utils.benchmark``."""

from . import benchmark as benchmark
from . import data as data
from . import tensorboard as tensorboard
