"""Data loading and the step executor (re-exported as ``cerebrax.utils.data``)."""

from ._streamers import DataLoaderCheckpoint as DataLoaderCheckpoint
from ._streamers import RestartableDataLoader as RestartableDataLoader
from ._dataloader import DataLoader as DataLoader
from ._dataloader import compute_num_steps as compute_num_steps
from ._dataloader import to_device as to_device
from ._executor import DataExecutor as DataExecutor
from ._executor import current_executor as current_executor
