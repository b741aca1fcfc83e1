"""``cstorch.utils.data``: DataLoader, DataExecutor and the restartable-loader protocol."""

from ..data import DataExecutor as DataExecutor
from ..data import DataLoader as DataLoader
from ..data import DataLoaderCheckpoint as DataLoaderCheckpoint
from ..data import RestartableDataLoader as RestartableDataLoader
from ..data import compute_num_steps as compute_num_steps
