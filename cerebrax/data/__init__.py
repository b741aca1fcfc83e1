"""Data loading and the step executor (re-exported as ``cerebrax.utils.data``)."""

from ._streamers import DataLoaderCheckpoint as DataLoaderCheckpoint
from ._streamers import RestartableDataLoader as RestartableDataLoader
from ._dataloader import DataLoader as DataLoader
from ._dataloader import compute_num_steps as compute_num_steps
from ._dataloader import to_device as to_device
from ._executor import DataExecutor as DataExecutor
from ._executor import current_executor as current_executor
from ._profiler import Profiler as Profiler
from ._profiler import RateTracker as RateTracker
from ._sampler import DistributedSampler as DistributedSampler
from ._sampler import pad_index as pad_index
from ._schedule import Schedule as Schedule
from ._torch_workers import safe_iter as safe_iter
from ._torch_workers import use_safe_start_method as use_safe_start_method


def __getattr__(name: str):
    # SyntheticDataset is a torch IterableDataset: it loads torch on first use, not with
    # cerebrax.
    if name == "SyntheticDataset":
        from ._synthetic import SyntheticDataset

        return SyntheticDataset
    raise AttributeError(f"module 'cerebrax.data' has no attribute {name!r}")
