"""``cstorch.utils``: data utilities in ``cstorch.utils.data``, TensorBoard summaries in
``cstorch.utils.tensorboard``."""

from . import data as data
from . import tensorboard as tensorboard
