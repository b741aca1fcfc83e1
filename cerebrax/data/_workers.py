"""Streaming workers: threads that build, convert, place and prefetch a DataLoader's batches.

Layout. A stream has one thread per streaming rank (see ``_streamers``). Each calls
``input_fn`` itself (a run without CSX workers reuses the user node's iterable), converts
its batches to numpy on the host and puts them into its own bounded queue. One feeder
thread takes the batches in a fixed order -- step ``s`` takes the next batch of local
worker ``s % num_workers_per_csx`` of every system and concatenates the systems'
batches -- checks the batch size, places the batch on the device and puts it into the
output queue that the step reads. Every queue holds ``prefetch`` batches, so the step
does not wait for data that is ready, and the order never depends on thread timing.

Inline. A stream made with ``background=False`` (what a DataLoader with one streaming
rank uses on a CPU backend) starts no thread: :meth:`Stream.next` runs the same worker
generator, checks and placement in the calling thread. The traced step runs
asynchronously, so the next batch is read while the device computes, and no thread
contends for the interpreter.

Failures. Every thread catches what its code raises and sends it down its queue in
place of its next batch, so the step sees the error exactly where that batch would
have been, with the worker's traceback. Every blocking put and get polls a stop event,
so closing the stream (the consumer stopped early, or failed) ends all threads promptly.
"""

from __future__ import annotations

import copy
import dataclasses
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from .._filters import is_array, is_torch_tensor
from .._placement import put_many
from .._runtime import RUNTIME
from .._step import mark_torch_origin, to_numpy
from ..errors import ConfigError, StateError
from ._torch_workers import safe_iter
from ._streamers import (
    DataLoaderCheckpoint,
    RestartableDataLoader,
    StreamerInfo,
    aggregates,
    bind,
    worker_state,
)

__all__ = ["Stream", "WorkerPosition", "mark_torch_leaves", "place", "to_host", "torch_dtypes"]

_POLL_S = 0.05  # how often a blocked put or get looks at the stop event
_JOIN_S = 2.0  # how long close() waits for the threads, in all

MSG_RAGGED = """\
Batch {step} of the DataLoader has a different batch size than the first batch:
{rows}
A traced step compiles for one batch shape, so every batch must have the same batch
size, on every backend. Fix: pass drop_last=True to the torch DataLoader that input_fn
returns (or drop or pad the last, partial batch of the iterable yourself)."""

MSG_EMPTY = "The DataLoader's input_fn produced no batches (in streaming worker {rank})."

MSG_ONE_SHOT = """\
The DataLoader's input_fn returned an iterator that is exhausted after one pass, and
the run needs more batches than one pass holds. Return a re-iterable object (a list, a
torch DataLoader), or run no more steps than one pass (num_steps=...)."""


# ---- batch conversion -------------------------------------------------------------------------


def to_host(batch: Any) -> Any:
    """``batch`` with every torch tensor leaf (bfloat16 included) as a numpy array."""
    return jax.tree.map(
        lambda x: to_numpy(x) if is_torch_tensor(x) else x, batch, is_leaf=is_torch_tensor
    )


def torch_dtypes(batch: Any) -> list:
    """The torch dtype of every leaf of ``batch`` that is a torch tensor (None for others)."""
    leaves = jax.tree.leaves(batch, is_leaf=is_torch_tensor)
    return [x.dtype if is_torch_tensor(x) else None for x in leaves]


def mark_torch_leaves(batch: Any, dtypes: list) -> None:
    """Marks the array leaves of a placed ``batch`` that were torch tensors (``dtypes``
    from :func:`torch_dtypes`), so a torch model's step sees them as torch tensors."""
    for x, dtype in zip(jax.tree.leaves(batch), dtypes):
        if dtype is not None and isinstance(x, jax.Array):
            mark_torch_origin(x, dtype)


def place(batch: Any, placement: Any) -> Any:
    """``batch`` with every array leaf put on ``placement`` (a device or a sharding).

    On a mesh that spans processes each process copies only its own devices' slices
    of the global batch, and no collective runs (placement may run in a data thread).
    """
    leaves, treedef = jax.tree.flatten(batch)
    placed = _place_leaves(leaves, placement)
    return batch if placed is leaves else jax.tree.unflatten(treedef, placed)


def _place_leaves(leaves: list, placement: Any) -> list:
    """:func:`place` on a flat list of leaves (the same list if nothing moves)."""
    where = [i for i, x in enumerate(leaves)
             if isinstance(x, np.ndarray) or (is_array(x) and not _on(x, placement))]
    if not where:
        return leaves  # already where it belongs: batches pre-placed by the user
    values = [leaves[i] for i in where]
    if placement is None or isinstance(placement, jax.Device) or (
            isinstance(placement, jax.sharding.Sharding) and placement.is_fully_addressable):
        # One placement for every leaf, in this process: a single call with a single
        # placement (a list of per-leaf placements takes JAX's slower path).
        moved = jax.device_put(values, placement)
    else:
        moved = put_many(values, placement)
    placed = list(leaves)
    for i, x in zip(where, moved):
        placed[i] = x
    return placed


def _on(x: Any, placement: Any) -> bool:
    """Whether ``x`` is a JAX array that already lives on ``placement``."""
    if not isinstance(x, jax.Array):
        return False
    if placement is None:
        return True
    if isinstance(placement, jax.Device):
        devices = x.sharding.device_set
        return len(devices) == 1 and placement in devices
    return x.sharding == placement


def _leading_rows(leaves: list) -> int:
    """The batch size: dim 0 of the first array leaf (1 for a 0-d or array-less batch)."""
    for x in leaves:
        if isinstance(x, np.ndarray) or is_array(x):
            shape = np.shape(x)
            return int(shape[0]) if shape else 1
    return 1


def _flatten_to_host(batch: Any) -> tuple[list, Any, list]:
    """``batch`` as flat leaves with torch tensors as numpy, its treedef, and the torch
    dtype of every leaf (None for the others): one pass over the tree."""
    leaves, treedef = jax.tree.flatten(batch)  # torch tensors are leaves
    dtypes = [x.dtype if is_torch_tensor(x) else None for x in leaves]
    host = [x if d is None else _host_array(x) for x, d in zip(leaves, dtypes)]
    return host, treedef, dtypes


def _host_array(tensor: Any) -> np.ndarray:
    try:
        return tensor.numpy()  # the usual CPU tensor: a view, at once
    except (RuntimeError, TypeError):  # bfloat16, requires_grad, conj/neg bits, on a GPU
        return to_numpy(tensor)


def _concat_leaves(parts: list[_HostBatch]) -> list:
    """The systems' batches joined along the batch dimension (the global batch)."""
    treedef = parts[0].treedef
    if any(p.treedef != treedef for p in parts[1:]):
        raise ConfigError(
            "The streaming workers' batches differ in structure "
            f"({[str(p.treedef) for p in parts]}); every worker's input_fn must return "
            "batches of the same nested structure."
        )

    def join(leaves: tuple) -> Any:
        if is_array(leaves[0]) and np.ndim(leaves[0]) >= 1:
            return np.concatenate([np.asarray(x) for x in leaves])
        return leaves[0]

    return [join(leaves) for leaves in zip(*(p.leaves for p in parts))]


class _BatchSizeCheck:
    """Raises when a batch's dim 0 differs, on some leaf, from the first batch's.

    The usual case (same structure, same leading dimensions) compares two short lists;
    leaf paths are only spelled out to report a difference.
    """

    def __init__(self) -> None:
        self.first: tuple[Any, list] | None = None  # treedef, shapes of the leaves

    def __call__(self, leaves: list, treedef: Any, step: int) -> None:
        shapes = [x.shape if isinstance(x, np.ndarray) or is_array(x) else None
                  for x in leaves]
        if self.first is None:
            self.first = (treedef, shapes)
            return
        first_treedef, first_shapes = self.first
        if treedef == first_treedef and _same_rows(shapes, first_shapes):
            return
        before, now = _by_path(*self.first), _by_path(treedef, shapes)
        rows = [
            f"  batch{path}: first batch {before[path]}, this batch {shape}"
            for path, shape in now.items()
            if path in before and shape[:1] != before[path][:1]
        ]
        if rows:
            raise ConfigError(MSG_RAGGED.format(step=step, rows="\n".join(rows)))


def _same_rows(shapes: list, first: list) -> bool:
    """Whether every leaf that is an array in both batches has the same dim 0."""
    for a, b in zip(shapes, first):
        if a is not None and b is not None and a[:1] != b[:1]:
            return False
    return True


def _by_path(treedef: Any, shapes: list) -> dict[str, tuple[int, ...]]:
    """``{keystr(path): shape}`` of the array leaves of a batch's ``treedef``."""
    indexed = jax.tree.unflatten(treedef, list(range(len(shapes))))
    return {jax.tree_util.keystr(path): shapes[i]
            for path, i in jax.tree_util.tree_leaves_with_path(indexed)
            if shapes[i] is not None}


# ---- messages between the threads ---------------------------------------------------------------


@dataclasses.dataclass
class _Failure:
    error: BaseException
    where: str  # "streaming worker 1 of 2", or "" for cerebrax's own checks


@dataclasses.dataclass
class WorkerPosition:
    """How far one worker's data has been consumed by the step.

    ``epoch`` and ``position`` (batches of that epoch) locate the last consumed batch;
    ``batches`` and ``samples`` count what was consumed in all; ``user_state`` is the
    restartable loader's state after that batch (None for other loaders).
    """

    epoch: int = 0
    position: int = 0
    batches: int = 0
    samples: int = 0
    user_state: Any = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _HostBatch:
    leaves: list  # the batch's flat leaves, torch tensors as numpy arrays
    treedef: Any
    position: WorkerPosition
    torch_dtypes: list  # per leaf: the torch dtype it came in with, or None


@dataclasses.dataclass
class _Placed:
    batch: Any
    parts: list[tuple[int, WorkerPosition]]  # (worker rank, its position after this batch)
    rows: int  # the global batch size


def _set_epoch(source: Any, epoch: int) -> None:
    """Tells epoch-aware samplers and datasets (``set_epoch``) which epoch starts."""
    for obj in (source, getattr(source, "sampler", None), getattr(source, "batch_sampler", None),
                getattr(source, "dataset", None)):
        set_epoch = getattr(obj, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


# ---- the threads ----------------------------------------------------------------------------


class _Worker:
    """One streaming rank: builds its iterable and streams host batches into its queue."""

    def __init__(
        self, stream: Stream, info: StreamerInfo, make_source: Callable[[], Any],
        start: WorkerPosition,
    ):
        self.stream, self.info, self.make_source, self.start = stream, info, make_source, start
        self.queue: queue.Queue = queue.Queue(maxsize=stream.prefetch)
        self.thread = threading.Thread(
            target=self._run, name=f"cerebrax-streamer-{info.rank}", daemon=True
        )

    @property
    def where(self) -> str:
        return f"streaming worker {self.info.rank} of {self.info.num_streamers}"

    def _run(self) -> None:
        with bind(self.info):
            try:
                for item in self.produce():
                    if not self.stream.put(self.queue, item):
                        return
            except BaseException as error:  # noqa: BLE001 - the step re-raises it
                self.stream.put(self.queue, _Failure(error, self.where))

    def _checkpoint(self, pos: WorkerPosition, user_state: Any = None) -> DataLoaderCheckpoint:
        info, k = self.info, self.info.workers_per_csx
        return DataLoaderCheckpoint(
            local_worker_id=info.local_worker_id, num_workers_per_csx=k,
            num_csx=info.num_csx, wse_id=info.wse_id,
            appliance_step=(pos.batches - 1) * k + info.local_worker_id + 1 if pos.batches else 0,
            worker_step=pos.batches, samples_streamed=pos.samples, user_state_dict=user_state,
        )

    def produce(self) -> Iterator[_HostBatch]:
        """This worker's host batches, in order, after the ones a saved run consumed."""
        source = self.make_source()
        # An iterable of cstorch's aggregated protocol loads only the aggregate of all
        # workers' states, which cerebrax does not build: it is replayed instead.
        restartable = isinstance(source, RestartableDataLoader) and not aggregates(source)
        start = self.start
        restored = restartable and start.user_state is not None
        if restored:
            with worker_state(self._checkpoint(start, start.user_state)):
                source.load_state_dict(start.user_state)
        # Without a restored state, replay the batches the saved run consumed.
        target = (start.epoch, start.position)
        epoch, position = target if restored else (0, 0)
        batches, samples = start.batches, start.samples
        first_pass = True
        while not self.stream.stop.is_set():
            _set_epoch(source, epoch)
            seen = 0
            replaying = (epoch, 0) < target
            for batch in safe_iter(source):
                seen += 1
                position += 1
                if replaying and (epoch, position) <= target:  # consumed before: replay
                    if self.stream.stop.is_set():
                        return
                    continue
                host, treedef, dtypes = _flatten_to_host(batch)
                batches += 1
                samples += _leading_rows(host)
                pos = WorkerPosition(epoch, position, batches, samples)
                if restartable:
                    with worker_state(self._checkpoint(pos)):
                        pos.user_state = copy.deepcopy(source.state_dict())
                yield _HostBatch(host, treedef, pos, dtypes)
            if seen == 0 and not (restored and first_pass):
                raise ConfigError(MSG_EMPTY.format(rank=self.info.rank))
            # Not iter(source) is source: iter() of a torch DataLoader draws its
            # shuffle seed, and the next epoch's order would not be torch's.
            if isinstance(source, Iterator):
                raise ConfigError(MSG_ONE_SHOT)
            epoch, position, first_pass = epoch + 1, 0, False


class Stream:
    """The workers, the feeder and the output queue of one pass over a DataLoader.

    Args:
      infos: one streaming context per worker, in rank order.
      make_source: called in each worker's context to build its iterable.
      placement: the device or sharding the batches are put on.
      steps: the global batches a saved run consumed (0 for a fresh run).
      positions: each worker's :class:`WorkerPosition` in that run.
      prefetch: batches each queue holds.
      background: run the workers and the feeder in threads. Without threads,
        :meth:`next` reads, converts and places each batch in the calling thread;
        the order, the checks, the positions and the errors are the same.
    """

    def __init__(
        self, infos: list[StreamerInfo], make_source: Callable[[], Any], placement: Any, *,
        steps: int = 0, positions: list[WorkerPosition] | None = None, prefetch: int = 2,
        background: bool = True,
    ):
        self.num_csx, self.per_csx = infos[0].num_csx, infos[0].workers_per_csx
        self.placement = placement
        self.prefetch = prefetch
        self.background = background
        self.stop = threading.Event()
        self.steps = steps
        self.last_rows: int | None = None  # the batch size of the last batch handed out
        self.positions = positions or [WorkerPosition() for _ in infos]
        self.workers = [
            _Worker(self, info, make_source, pos) for info, pos in zip(infos, self.positions)
        ]
        self.closed = False
        self._check = _BatchSizeCheck()
        if not background:
            self._producers: list[Iterator[_HostBatch] | None] = [None] * len(self.workers)
            return
        self.out: queue.Queue = queue.Queue(maxsize=prefetch)
        self.feeder = threading.Thread(target=self._feed, name="cerebrax-feeder", daemon=True)
        RUNTIME.streams.add(self)  # cstorch.reset() stops it
        for worker in self.workers:
            worker.thread.start()
        self.feeder.start()

    # ---- blocking queue operations that give way to stop ----
    def put(self, q: queue.Queue, item: Any) -> bool:
        """Puts ``item`` into ``q``; False (and nothing put) once the stream stops."""
        while not self.stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                pass
        return False

    def _get(self, q: queue.Queue, thread: threading.Thread, where: str) -> Any:
        """The next item of ``q``; None once the stream stops."""
        while not self.stop.is_set():
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                if not thread.is_alive() and q.empty():
                    return _Failure(StateError(f"The {where} stopped without a batch."), "")
        return None

    # ---- the feeder ----
    def _assemble(self, step: int, take: Callable[[_Worker], Any]) -> _Placed | _Failure | None:
        """Global batch ``step``: one host batch per system, checked, joined and placed.

        ``take(worker)`` gives that worker's next item (a failure, or None once stopped).
        """
        local = step % self.per_csx
        parts = []
        for csx in range(self.num_csx):
            worker = self.workers[csx * self.per_csx + local]
            item = take(worker)
            if item is None or isinstance(item, _Failure):
                return item
            parts.append((worker.info.rank, item))
        first = parts[0][1]
        leaves = first.leaves if len(parts) == 1 else _concat_leaves([p for _, p in parts])
        self._check(leaves, first.treedef, step)
        placed = _place_leaves(leaves, self.placement)
        for x, dtype in zip(placed, first.torch_dtypes):
            if dtype is not None and isinstance(x, jax.Array):
                mark_torch_origin(x, dtype)
        return _Placed(jax.tree.unflatten(first.treedef, placed),
                       [(rank, item.position) for rank, item in parts], _leading_rows(leaves))

    def _feed(self) -> None:
        step = self.steps
        take = lambda w: self._get(w.queue, w.thread, w.where)  # noqa: E731
        try:
            while True:
                placed = self._assemble(step, take)
                if placed is None:
                    return
                if not self.put(self.out, placed) or isinstance(placed, _Failure):
                    return
                step += 1
        except BaseException as error:  # noqa: BLE001 - the step re-raises it
            self.put(self.out, _Failure(error, ""))

    def _take_inline(self, worker: _Worker) -> _HostBatch:
        """The next batch of ``worker``, read in the calling thread (in its context)."""
        info = worker.info
        producer = self._producers[info.rank]
        if producer is None:
            producer = self._producers[info.rank] = worker.produce()
        if not info.workers:
            # The only streamer of a run without workers: its context is the thread's
            # default one, so there is nothing to bind (this runs for every batch).
            return next(producer)
        with bind(info):
            try:
                return next(producer)
            except BaseException as error:
                if info.num_streamers > 1:
                    error.add_note(f"[cerebrax] raised in {worker.where} of the DataLoader "
                                   "while it ran input_fn or iterated its data.")
                raise

    # ---- the consumer side (the thread that runs the steps) ----
    def next(self) -> Any:
        """The next placed batch; raises what a worker or the feeder raised."""
        if self.closed:
            raise StateError("This DataLoader stream is closed; iterate the DataLoader again.")
        if not self.background:
            try:
                item = self._assemble(self.steps, self._take_inline)
            except BaseException:
                self.close()
                raise
        else:
            item = self._get(self.out, self.feeder, "batch feeder")
        if isinstance(item, _Failure):
            self.close()
            error = item.error
            if item.where:
                error.add_note(
                    f"[cerebrax] raised in {item.where} of the DataLoader while it ran "
                    "input_fn or iterated its data; the traceback's frames from "
                    "'_run' on are the worker's."
                )
            raise error
        for rank, pos in item.parts:
            self.positions[rank] = pos
        self.steps += 1
        self.last_rows = item.rows
        return item.batch

    def close(self) -> None:
        """Stops the threads (waiting up to 2 s for them) and drops the queued batches."""
        if self.closed:
            return
        self.closed = True
        self.stop.set()
        if not self.background:
            for producer in self._producers:
                if producer is not None:
                    producer.close()
            return
        threads = [self.feeder] + [w.thread for w in self.workers]
        deadline = _JOIN_S / len(threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(deadline)
        for q in [self.out] + [w.queue for w in self.workers]:
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        RUNTIME.streams.discard(self)
