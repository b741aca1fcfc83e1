"""Who is streaming: the sharding helpers of ``cstorch.distributed``.

A CSX run streams its data from ``num_csx x num_workers_per_csx`` streaming workers
(threads in cerebrax). Each worker calls the DataLoader's ``input_fn`` itself, inside a
thread-local context that the helpers below read, so an ``input_fn`` can give every
worker its own shard of the data:

    def input_fn(batch_size, seed=0):
        streamer = cstorch.distributed.is_streamer()
        num_tasks = cstorch.distributed.num_streamers() if streamer else 1
        task_id = cstorch.distributed.get_streaming_rank() if streamer else 0
        shard = torch.utils.data.Subset(dataset, range(task_id, len(dataset), num_tasks))
        generator = torch.Generator().manual_seed(seed + task_id)  # workers shuffle differently
        return torch.utils.data.DataLoader(
            shard, cstorch.distributed.get_streaming_batch_size(batch_size),
            shuffle=True, generator=generator, drop_last=True)

Outside a worker, on the "user node" (the main thread of a CSX run that streams from
workers), ``is_streamer()`` is False; the user node calls ``input_fn`` only to learn the
length of the data. A run without CSX workers (CPU, GPU, or ``num_workers_per_csx=0``)
has one streamer, rank 0 of 1, which is also the user node: ``input_fn`` is called once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from ..backend import current_backend
from .._filters import is_strict_int
from ..errors import ConfigError, StateError

__all__ = [
    "DataLoaderCheckpoint",
    "RestartableDataLoader",
    "StreamerInfo",
    "aggregates",
    "get_ordinal",
    "get_streaming_batch_size",
    "get_streaming_rank",
    "get_worker_state",
    "is_master_ordinal",
    "is_streamer",
    "num_receivers",
    "num_streamers",
    "num_tasks",
]


@dataclasses.dataclass(frozen=True)
class StreamerInfo:
    """The place of one thread in the streaming layout of a run.

    Attributes:
      num_csx: systems that receive batches (their batches are concatenated).
      workers_per_csx: streaming workers per system.
      rank: ``wse_id * workers_per_csx + local_worker_id``; 0 on the user node.
      streamer: whether this thread streams data (False on the user node of a CSX run).
      workers: whether the run streams from worker threads (a CSX backend with
        ``num_workers_per_csx >= 1``).
    """

    num_csx: int = 1
    workers_per_csx: int = 1
    rank: int = 0
    streamer: bool = True
    workers: bool = False

    @property
    def num_streamers(self) -> int:
        return self.num_csx * self.workers_per_csx

    @property
    def wse_id(self) -> int:
        return self.rank // self.workers_per_csx

    @property
    def local_worker_id(self) -> int:
        return self.rank % self.workers_per_csx


def streaming_layout() -> tuple[int, int] | None:
    """``(num_csx, num_workers_per_csx)`` of a run that streams from workers, else None."""
    backend = current_backend(raise_exception=False)
    if backend is None or not backend.is_csx or backend.cluster_config is None:
        return None
    config = backend.cluster_config
    if config.num_workers_per_csx == 0:
        return None
    return config.num_csx, config.num_workers_per_csx


def user_node_info() -> StreamerInfo:
    """The context of the main thread: the user node, or the only streamer."""
    layout = streaming_layout()
    if layout is None:
        return StreamerInfo()
    return StreamerInfo(*layout, rank=0, streamer=False, workers=True)


def worker_infos() -> list[StreamerInfo]:
    """One context per streaming thread of the current backend, in rank order."""
    layout = streaming_layout()
    if layout is None:
        return [StreamerInfo()]
    num_csx, per_csx = layout
    return [StreamerInfo(num_csx, per_csx, rank, True, True) for rank in range(num_csx * per_csx)]


_LOCAL = threading.local()


class bind:  # noqa: N801 - used as a function: ``with bind(info):``
    """Makes ``info`` the streaming context of this thread for the block.

    A class rather than a generator context manager: it is entered for every batch
    read in the stepping thread, and this is several times cheaper.
    """

    __slots__ = ("info", "previous")

    def __init__(self, info: StreamerInfo):
        self.info = info

    def __enter__(self) -> StreamerInfo:
        self.previous = getattr(_LOCAL, "info", None)
        _LOCAL.info = self.info
        return self.info

    def __exit__(self, *exc: object) -> None:
        _LOCAL.info = self.previous


def current_info() -> StreamerInfo:
    info = getattr(_LOCAL, "info", None)
    return info if info is not None else user_node_info()


# ---- the helpers of cstorch.distributed ---------------------------------------------------


def num_streamers() -> int:
    """The number of streaming workers of the run (``num_csx * num_workers_per_csx``; 1
    without CSX workers)."""
    return current_info().num_streamers


def is_streamer() -> bool:
    """Whether this code runs in a streaming worker (True in a run without CSX workers,
    whose only streamer is the main thread)."""
    return current_info().streamer


def get_streaming_rank() -> int:
    """The rank of this streaming worker, in ``[0, num_streamers())``.

    Raises:
      StateError: on the user node of a CSX run, which streams nothing.
    """
    info = current_info()
    if not info.streamer:
        raise StateError(
            "get_streaming_rank() was called on the user node, which streams no data. "
            "Guard it: task_id = cstorch.distributed.get_streaming_rank() if "
            "cstorch.distributed.is_streamer() else 0."
        )
    return info.rank


def get_streaming_batch_size(effective_batch_size: int, global_rank: int | None = None) -> int:
    """The batch size this worker streams for a global batch of ``effective_batch_size``.

    A streaming worker feeds one of ``num_csx`` systems, whose batches are concatenated
    into the global batch: it streams ``effective_batch_size // num_csx`` samples, one
    more on the first ``effective_batch_size % num_csx`` systems. On the user node, and
    in a run with one system, it is ``effective_batch_size`` itself. ``global_rank``: the
    answer for the streaming worker of that rank instead of the caller.
    """
    if not is_strict_int(effective_batch_size) or effective_batch_size < 1:
        raise ConfigError(
            f"get_streaming_batch_size expects an integer batch size > 0, got "
            f"{effective_batch_size!r}."
        )
    info = current_info()
    if global_rank is not None:
        if not is_strict_int(global_rank) or not 0 <= global_rank < info.num_streamers:
            raise ConfigError(
                f"get_streaming_batch_size(global_rank={global_rank!r}): the rank of a "
                f"streaming worker, an integer in [0, {info.num_streamers}).")
        info = dataclasses.replace(info, rank=global_rank, streamer=True)
    if not info.streamer or info.num_csx == 1:
        return effective_batch_size
    if effective_batch_size < info.num_csx:
        raise ConfigError(
            f"The global batch size {effective_batch_size} is smaller than num_csx="
            f"{info.num_csx}: every system needs at least one sample per step."
        )
    share, extra = divmod(effective_batch_size, info.num_csx)
    return share + (1 if info.wse_id < extra else 0)


def num_tasks() -> int:
    """The tasks of the run: the user node plus the streaming workers (1 without workers)."""
    info = current_info()
    return info.num_streamers + 1 if info.workers else 1


def get_ordinal() -> int:
    """This task's ordinal: 0 on the user node, ``1 + rank`` on a streaming worker."""
    info = current_info()
    return info.rank + 1 if info.workers and info.streamer else 0


def is_master_ordinal() -> bool:
    """Whether this is the user node (ordinal 0)."""
    return get_ordinal() == 0


def num_receivers() -> int:
    """The systems that receive streamed batches (``num_csx``; 1 without workers)."""
    info = current_info()
    return info.num_csx if info.workers else 1


# ---- restartable data -----------------------------------------------------------------------


@runtime_checkable
class RestartableDataLoader(Protocol):
    """An object built by ``input_fn`` that saves and restores its own position.

    When the object an ``input_fn`` returns has ``state_dict()`` and
    ``load_state_dict(state)``, the DataLoader asks it for its state after every batch
    it streams (inside ``state_dict()``, :func:`get_worker_state` describes the worker
    and the batch), keeps the state of the last batch the step consumed, and on resume
    hands that state back instead of replaying the skipped batches.

    An object that also has ``aggregate_state_dict`` and ``deaggregate_state_dict``
    (cstorch's protocol, Model Zoo's restartable loader) loads only the aggregate of all
    workers' states, in a format of its own, which cerebrax does not build. Such an
    object is not handed a state: on resume the DataLoader replays the batches the saved
    run consumed (it builds the object again and skips them), so the resumed run sees the
    batches of the run never stopped, at the cost of reading the skipped ones.
    """

    def state_dict(self) -> Any:
        """The object's position after the last batch it yielded; the DataLoader calls
        it after every batch it streams and keeps a deep copy."""

    def load_state_dict(self, state_dict: Any) -> Any:
        """Restores a position :meth:`state_dict` returned, before the iteration that
        resumes from it."""


def aggregates(source: Any) -> bool:
    """Whether ``source`` follows cstorch's aggregated protocol (``aggregate_state_dict``
    and ``deaggregate_state_dict`` beside ``state_dict`` and ``load_state_dict``)."""
    return all(callable(getattr(source, name, None))
               for name in ("aggregate_state_dict", "deaggregate_state_dict"))


@dataclasses.dataclass(frozen=True)
class DataLoaderCheckpoint:
    """What :func:`get_worker_state` tells a restartable loader about its worker.

    Attributes:
      local_worker_id: the worker's index on its system.
      num_workers_per_csx, num_csx: the streaming layout.
      wse_id: the system the worker feeds.
      appliance_step: the global steps done once this worker's last batch is consumed.
      worker_step: the batches this worker has streamed.
      samples_streamed: the samples (batch rows) this worker has streamed.
      user_state_dict: the state being restored (in ``load_state_dict``), else None.
    """

    local_worker_id: int
    num_workers_per_csx: int
    num_csx: int
    wse_id: int
    appliance_step: int
    worker_step: int
    samples_streamed: int
    user_state_dict: Any = None


@contextlib.contextmanager
def worker_state(state: DataLoaderCheckpoint) -> Iterator[None]:
    previous = getattr(_LOCAL, "worker_state", None)
    _LOCAL.worker_state = state
    try:
        yield
    finally:
        _LOCAL.worker_state = previous


def get_worker_state() -> DataLoaderCheckpoint:
    """The streaming worker's position; valid inside a restartable loader's
    ``state_dict()`` and ``load_state_dict()`` while the DataLoader calls them."""
    state = getattr(_LOCAL, "worker_state", None)
    if state is None:
        raise StateError(
            "get_worker_state() is only available inside the state_dict() and "
            "load_state_dict() methods of the object input_fn returns, while the "
            "cstorch DataLoader calls them."
        )
    return state
