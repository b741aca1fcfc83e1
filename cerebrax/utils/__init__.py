"""``cstorch.utils``: data utilities in ``cstorch.utils.data``, TensorBoard summaries in
``cstorch.utils.tensorboard``, a data loader benchmark in ``cstorch.utils.benchmark``, and
cstorch's small helpers: ``call_once``, ``nest``, ``tracker``, ``utils`` (parameter
filters), and the compiler annotations ``kernel`` and ``num_kv_groups``."""

from . import benchmark as benchmark
from . import call_once as call_once
from . import data as data
from . import kernel as kernel
from . import nest as nest
from . import num_kv_groups as num_kv_groups
from . import tensorboard as tensorboard
from . import tracker as tracker
from . import utils as utils
