"""``cstorch.utils.data``: DataLoader, DataExecutor, samplers, synthetic data and the
restartable-loader protocol; submodules ``utils`` (``infer_batch_size``),
``sampler`` (``pad_index``) and ``data_executor`` (``MbsSetting``) as cstorch has them."""

from ...data import DataExecutor as DataExecutor
from ...data import DataLoader as DataLoader
from ...data import DataLoaderCheckpoint as DataLoaderCheckpoint
from ...data import DistributedSampler as DistributedSampler
from ...data import RestartableDataLoader as RestartableDataLoader
from ...data import Schedule as Schedule
from ...data import compute_num_steps as compute_num_steps
from . import data_executor as data_executor
from . import sampler as sampler
from . import utils as utils


def __getattr__(name: str):
    # SyntheticDataset is a torch IterableDataset: it loads torch on first use.
    if name == "SyntheticDataset":
        from ...data import SyntheticDataset

        return SyntheticDataset
    raise AttributeError(f"module 'cerebrax.utils.data' has no attribute {name!r}")
