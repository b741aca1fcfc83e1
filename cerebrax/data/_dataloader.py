"""``DataLoader``: a cstorch data loader built from an ``input_fn``.

Every streaming worker calls ``input_fn`` itself to build its own iterable (a torch
DataLoader, or any iterable of numpy / torch / JAX batches, nested tuples and dicts
included), restarting it at the end of each epoch. The batches are converted and placed
on the backend's device while the asynchronous step runs: by worker threads that keep a
few ready when there are several streaming workers or the device is an accelerator, in
the stepping thread for one streamer on a CPU backend (see ``_workers``); the sharding
helpers of ``cstorch.distributed`` tell an ``input_fn`` which worker it runs in (see
``_streamers``).
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .._filters import check_int
from ..errors import ConfigError, StateError
from . import _streamers, _workers
from ._executor import DataExecutor

__all__ = ["DataLoader", "compute_num_steps", "to_device"]

STATE_VERSION = 1


def _check_count(name: str, value: Any, minimum: int = 1) -> None:
    bound = {"gt": 0} if minimum == 1 else {"ge": 0}
    check_int(f"DataLoader({name}=...)", value, optional=True, **bound)


def _length(data: Any) -> int | None:
    if data is None or isinstance(data, int):
        return data
    if isinstance(data, DataLoader):
        return data.source_length()
    try:
        return len(data)
    except TypeError:
        return None


def compute_num_steps(
    dataloader: Any,
    initial_step: int = 0,
    num_steps: int | None = None,
    max_steps: int | None = None,
    num_epochs: int | None = None,
    steps_per_epoch: int | None = None,
    grad_accum_steps: int = 1,
) -> int:
    """The number of steps a run takes (cstorch's rules).

    Args:
      dataloader: the data (a cstorch DataLoader, any sized iterable), its number of
        batches, or None when unknown.
      initial_step: steps already done (a resumed run); only ``max_steps`` counts them.
      num_steps: steps to run; exclusive with ``num_epochs``.
      max_steps: the last step of the whole run: at most ``max_steps - initial_step``
        steps run.
      num_epochs: passes over the data, of ``steps_per_epoch`` batches each (default:
        all batches, at most that many).
      grad_accum_steps: batches per optimizer step; an epoch has
        ``steps_per_epoch // grad_accum_steps`` steps.

    Returns:
      The minimum of ``num_epochs * steps_per_epoch``, ``num_steps`` and
      ``max_steps - initial_step`` over those given; the number of batches (divided by
      ``grad_accum_steps``) when none is.

    Example:
      >>> from cerebrax.utils.data import compute_num_steps
      >>> compute_num_steps(10, num_epochs=3, max_steps=25)  # min(3 epochs x 10, 25)
      25
      >>> compute_num_steps(10, num_epochs=3, grad_accum_steps=2)  # 3 x (10 // 2)
      15
    """
    for name, value in (("num_steps", num_steps), ("max_steps", max_steps),
                        ("num_epochs", num_epochs), ("steps_per_epoch", steps_per_epoch),
                        ("grad_accum_steps", grad_accum_steps)):
        _check_count(name, value)
    _check_count("initial_step", initial_step, minimum=0)
    if num_steps is not None and num_epochs is not None:
        raise ConfigError("Only one of num_steps and num_epochs may be given.")
    length = _length(dataloader)
    candidates = []
    if num_epochs is not None:
        spe = steps_per_epoch if steps_per_epoch is not None else length
        if spe is None:
            raise ConfigError(
                "num_epochs needs steps_per_epoch when the data has no length (an "
                "iterable without __len__)."
            )
        if length is not None and spe > length:
            raise ConfigError(
                f"steps_per_epoch={spe} is larger than the number of batches ({length})."
            )
        if spe < grad_accum_steps:
            raise ConfigError(
                f"steps_per_epoch={spe} is smaller than grad_accum_steps={grad_accum_steps}: "
                "an epoch must hold at least one optimizer step."
            )
        candidates.append(num_epochs * (spe // grad_accum_steps))
    if num_steps is not None:
        candidates.append(num_steps)
    if max_steps is not None:
        if max_steps <= initial_step:
            raise ConfigError(
                f"max_steps={max_steps} is already reached: the run starts at "
                f"initial_step={initial_step}. Raise max_steps to train further."
            )
        candidates.append(max_steps - initial_step)
    if candidates:
        return min(candidates)
    if length is None:
        raise ConfigError(
            "Could not infer the number of steps: give num_steps (or num_epochs with "
            "steps_per_epoch) to the DataLoader or to the DataExecutor."
        )
    return length // grad_accum_steps


def to_device(batch: Any, device: jax.Device | jax.sharding.Sharding | None = None) -> Any:
    """``batch`` with every numpy / torch / JAX array leaf placed on ``device``.

    torch tensors (bfloat16 included) become JAX arrays of the same dtype, which a
    traced step of a torch model sees as torch tensors again; other leaves (Python
    numbers, strings) are kept as they are.
    """
    placed = _workers.place(_workers.to_host(batch), device)
    _workers.mark_torch_leaves(placed, _workers.torch_dtypes(batch))
    return placed


MSG_LAYOUT = """This DataLoader state was saved by a run that streamed from num_csx={saved[0]} x
num_workers_per_csx={saved[1]} workers, but this run streams from num_csx={now[0]} x
num_workers_per_csx={now[1]}; the batch order depends on that layout, so the resumed
run would not see the batches the saved run saw next. Fix: resume with the saved
cluster configuration."""


class DataLoader:
    """Wraps an ``input_fn`` that builds the data iterable (cstorch's DataLoader).

    Args:
      input_fn: called as ``input_fn(*args, **kwargs)``; returns a torch DataLoader or
        any iterable of batches (numpy / torch / JAX arrays in nested tuples, lists and
        dicts). Every batch must have the same batch size (else a ``ConfigError`` naming
        ``drop_last=True``).
      num_steps, max_steps, num_epochs, steps_per_epoch: how many steps to yield
        (see :func:`compute_num_steps`). These four names are the loader's own: they
        are never passed on to ``input_fn``; every other argument is.

    Attributes:
      id: an integer no other DataLoader of the process has (cstorch's; Model Zoo names
        its validation loops by it). A copy keeps it.

    Streaming. A CSX backend with ``ClusterConfig(num_csx=n, num_workers_per_csx=k)``
    streams from ``n * k`` worker threads; each calls ``input_fn`` itself, and the
    helpers of ``cstorch.distributed`` (``num_streamers()``, ``get_streaming_rank()``,
    ``get_streaming_batch_size(batch_size)``) tell it which shard to stream. Step ``s``
    takes the next batch of local worker ``s % k`` of every system (the ``n`` batches
    are concatenated), so the order is the same in every run. To shuffle differently
    in every worker, seed the shuffle with ``seed + get_streaming_rank()``; to give the
    workers disjoint shards, select the rows ``rank::num_streamers()`` (or use a torch
    ``DistributedSampler`` with ``num_replicas=num_streamers(), rank=rank`` and the
    same seed everywhere; its ``set_epoch`` is called at every epoch). Without CSX
    workers (CPU, GPU, ``num_workers_per_csx=0``) one streamer iterates the single
    ``input_fn`` call's iterable. On an accelerator it runs in a background thread, on
    the host cores the device leaves free. On a CPU backend the step computes on the
    host's own cores, so the batches are read in the stepping thread, between steps:
    the traced step runs asynchronously, so the next batch is read, converted and
    placed while XLA computes, and no thread contends with the step's dispatch for
    the cores and the Python interpreter (measured faster on 2 cores, see
    benchmarks/RESULTS.md). ``loader.background = True`` (or False) overrides the
    choice, e.g. for an input pipeline that waits on disk or network. Worker threads
    convert batches to JAX arrays and place them on the device in the background,
    ``prefetch`` (default 2) batches ahead per worker. An exception in
    ``input_fn`` or in the iteration reaches the step that would have received the
    batch, with the worker's traceback.

    Torch loaders with workers. A torch DataLoader with ``num_workers > 0`` and no
    ``multiprocessing_context`` of its own gets ``"forkserver"`` (``"spawn"`` where
    there is none): forking a process that runs JAX's threads can deadlock a worker.
    Its dataset, ``collate_fn`` and ``worker_init_fn`` then travel to the workers by
    pickle, so define them at module level and keep the script's training code under
    ``if __name__ == "__main__":``; one that cannot be pickled raises a ``ConfigError``
    naming these fixes before any worker starts (see ``_torch_workers``).

    Resuming. :meth:`state_dict` records the batches the steps consumed from every
    worker; :meth:`load_state_dict` makes the next pass skip them, so a resumed run
    sees exactly the batches the uninterrupted run saw next, provided ``input_fn`` is
    deterministic (seeded shuffles). Skipped batches are read again but neither
    converted nor placed; an iterable that implements ``state_dict()`` and
    ``load_state_dict()`` (:class:`RestartableDataLoader`) is restored from its own
    state instead.

    Iterating the loader directly runs an implicit ``DataExecutor`` (with the
    ``checkpoint_steps`` of ``cstorch.configure``), so the seeds' plain
    ``for batch in dataloader`` loops work.

    Example:
      >>> import numpy as np
      >>> from cerebrax.utils.data import DataLoader
      >>> loader = DataLoader(lambda n: [np.full((2,), i) for i in range(n)], 3, num_epochs=2)
      >>> len(loader), [int(batch[0]) for batch in loader]
      (6, [0, 1, 2, 0, 1, 2])
    """

    prefetch: int = 2  # batches buffered per worker, and placed on the device
    # Stream in background threads. None: with several streaming workers, or when the
    # device is an accelerator (on a CPU backend the step computes on the host's cores).
    background: bool | None = None

    _ids = itertools.count()  # a loader's ``id``: unique in the process, as cstorch's

    def __init__(
        self,
        input_fn: Callable[..., Any],
        *args: Any,
        num_steps: int | None = None,
        max_steps: int | None = None,
        num_epochs: int | None = None,
        steps_per_epoch: int | None = None,
        **kwargs: Any,
    ):
        if not callable(input_fn):
            raise ConfigError(
                f"DataLoader expects a callable input_fn that builds the data, got "
                f"{type(input_fn).__name__}. Wrap the data: DataLoader(lambda: data)."
            )
        for name, value in (("num_steps", num_steps), ("max_steps", max_steps),
                            ("num_epochs", num_epochs), ("steps_per_epoch", steps_per_epoch)):
            _check_count(name, value)
        if num_steps is not None and num_epochs is not None:
            raise ConfigError("Only one of num_steps and num_epochs may be given.")
        self.id = next(DataLoader._ids)
        self.input_fn = input_fn
        self.input_fn_args = args
        self.input_fn_kwargs = kwargs
        self._counts = dict(num_steps=num_steps, max_steps=max_steps,
                            num_epochs=num_epochs, steps_per_epoch=steps_per_epoch)
        self._source: Any = None
        self._source_lock = threading.Lock()
        self._stream: _workers.Stream | None = None
        self._resume: dict[str, Any] | None = None

    def _call_input_fn(self) -> Any:
        return self.input_fn(*self.input_fn_args, **self.input_fn_kwargs)

    @property
    def source(self) -> Any:
        """The user node's iterable (built once, on first use, in the user node's context).

        Without CSX workers this is also the iterable the only streamer iterates.
        """
        with self._source_lock:
            if self._source is None:
                with _streamers.bind(_streamers.user_node_info()):
                    self._source = self._call_input_fn()
            return self._source

    @property
    def dataloader(self) -> Any:
        """The iterable ``input_fn`` built (a torch DataLoader, a list, ...).

        The same object as :attr:`source`: built once, on first use, in the user node's
        context. As in cstorch, this is an attribute, not a method.
        """
        return self.source

    @property
    def batch_size(self) -> int | None:
        """The batch size (rows) of the last batch streamed; None before the first."""
        return None if self._stream is None else self._stream.last_rows

    @property
    def is_restartable(self) -> bool:
        """Whether :attr:`dataloader` saves and restores its own position
        (:class:`RestartableDataLoader`: ``state_dict()`` and ``load_state_dict()``)."""
        return isinstance(self.source, _streamers.RestartableDataLoader)

    def source_length(self) -> int | None:
        """The number of batches of the user node's iterable, None when it has no length."""
        source = self.source  # built outside the try: a TypeError in input_fn is its own
        try:
            return len(source)
        except TypeError:
            return None

    @property
    def num_steps(self) -> int:
        """The steps a loop over the loader runs (also ``len(loader)``):
        :func:`compute_num_steps` of the iterable's length and the ``num_steps``,
        ``max_steps``, ``num_epochs`` and ``steps_per_epoch`` the loader was given.

        It builds the iterable (calls ``input_fn``) if that has not happened yet.
        """
        return compute_num_steps(self.source_length(), **self._counts)

    def __len__(self) -> int:
        return self.num_steps

    # ---- streaming -------------------------------------------------------------------------
    def batches(
        self, device: jax.Device | jax.sharding.Sharding | None = None
    ) -> Iterator[Any]:
        """Batches placed on ``device`` (a device or a sharding), without end.

        Each call starts a new pass: from the state given to :meth:`load_state_dict`
        if there is one, else from the beginning. Closing the iterator (or dropping it)
        stops the worker threads.
        """
        infos = _streamers.worker_infos()
        if infos[0].workers:
            make_source = self._call_input_fn  # every worker builds its own iterable
        else:
            make_source = lambda: self.source  # noqa: E731 - the single input_fn call
        steps, positions = self._take_resume(infos)
        background = self.background
        if background is None:
            background = len(infos) > 1 or _platform(device) != "cpu"
        stream = _workers.Stream(infos, make_source, device, steps=steps, positions=positions,
                                 prefetch=self.prefetch, background=background)
        self._stream = stream
        try:
            while True:
                yield stream.next()
        finally:
            stream.close()

    def __iter__(self) -> Iterator[Any]:
        yield from DataExecutor(self)

    # ---- resuming -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the steps are in the data: the batches consumed from every worker.

        Returns a dict of ints, lists and the restartable iterables' own states (H5
        checkpoint friendly): ``num_csx``, ``num_workers_per_csx``, ``steps`` (global
        batches consumed), ``workers`` (per worker rank: ``epoch``, ``position`` in
        that epoch, ``batches``, ``samples``, ``user_state``) and, as cstorch's,
        ``samples_streamed`` (the samples consumed, over all workers).
        """
        if self._stream is not None:
            stream = self._stream
            state = {
                "version": STATE_VERSION,
                "num_csx": stream.num_csx,
                "num_workers_per_csx": stream.per_csx,
                "steps": stream.steps,
                "workers": [copy.deepcopy(pos.as_dict()) for pos in stream.positions],
            }
        elif self._resume is not None:
            state = copy.deepcopy(self._resume)
        else:
            infos = _streamers.worker_infos()
            state = {
                "version": STATE_VERSION,
                "num_csx": infos[0].num_csx,
                "num_workers_per_csx": infos[0].workers_per_csx,
                "steps": 0,
                "workers": [_workers.WorkerPosition().as_dict() for _ in infos],
            }
        # cstorch's count of the samples the steps consumed, over all workers
        state["samples_streamed"] = sum(int(w["samples"]) for w in state["workers"])
        return state

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Makes the next pass (the next executor loop) start where ``state_dict`` was saved.

        Args:
          state_dict: a state of :meth:`state_dict`.
          strict: cstorch's flag, taken as cstorch code passes it. Both ways the state is
            checked: one that cannot be resumed exactly is refused (below), never applied
            loosely, since a loose resume would change the batches without a word.

        Raises:
          ConfigError: ``state_dict`` is not a DataLoader state, or it was saved with a
            different streaming layout (``num_csx``, ``num_workers_per_csx``).
          StateError: a pass over this loader is running.
        """
        if self._stream is not None and not self._stream.closed:
            raise StateError(
                "DataLoader.load_state_dict() was called while the loader is being "
                "iterated. Load the state before the loop over the DataExecutor starts."
            )
        if not isinstance(state_dict, dict) or state_dict.get("version") != STATE_VERSION:
            raise ConfigError(
                "DataLoader.load_state_dict() expects the dict of DataLoader.state_dict() "
                f"(version {STATE_VERSION}), got {type(state_dict).__name__} with keys "
                f"{sorted(state_dict) if isinstance(state_dict, dict) else None}."
            )
        self._resume = copy.deepcopy(dict(state_dict))
        self._stream = None

    def _take_resume(
        self, infos: list[_streamers.StreamerInfo]
    ) -> tuple[int, list[_workers.WorkerPosition] | None]:
        state, self._resume = self._resume, None
        if state is None:
            return 0, None
        saved = (state["num_csx"], state["num_workers_per_csx"])
        now = (infos[0].num_csx, infos[0].workers_per_csx)
        if saved != now or len(state["workers"]) != len(infos):
            raise ConfigError(MSG_LAYOUT.format(saved=saved, now=now))
        positions = [
            _workers.WorkerPosition(
                *(int(w[key]) for key in ("epoch", "position", "batches", "samples")),
                user_state=w.get("user_state"),
            )
            for w in state["workers"]
        ]
        return int(state["steps"]), positions


def _platform(placement: Any) -> str:
    """The platform ("cpu", "gpu", "tpu") of a device or a sharding (None: the default)."""
    if placement is None:
        return jax.devices()[0].platform
    if isinstance(placement, jax.Device):
        return placement.platform
    return next(iter(placement.device_set)).platform
