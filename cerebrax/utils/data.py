"""``cstorch.utils.data``: DataLoader and DataExecutor."""

from ..data import DataExecutor as DataExecutor
from ..data import DataLoader as DataLoader
from ..data import compute_num_steps as compute_num_steps
