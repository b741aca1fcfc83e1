"""``DataExecutor``: owns the step count, checkpoint steps and the closure queue."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import _step
from .._filters import check_int
from .._runtime import RUNTIME
from ..backend import current_backend, run_config
from ..errors import ConfigError, StateError
from ._profiler import Profiler
from ._progress import ProgressBar
from ._schedule import Schedule

if TYPE_CHECKING:
    from ._dataloader import DataLoader

__all__ = ["DataExecutor", "batch_placement", "current_executor", "current_executor_or_none"]



def current_executor_or_none() -> DataExecutor | None:
    return _step.current_executor()


def current_executor() -> DataExecutor:
    """The executor whose loop is running; raises when there is none."""
    executor = _step.current_executor()
    if executor is None:
        raise StateError(
            "Detected that a data executor was not used. Iterate over a "
            "cstorch.utils.data.DataExecutor(dataloader, num_steps=...) to run steps."
        )
    return executor


def _check_int(name: str, value: Any, minimum: int) -> int:
    return check_int(f"DataExecutor({name}=...)", value, ge=minimum)


def batch_placement() -> Any:
    """Where the current backend's steps take their batches: its device, or on a wafer
    mesh the sharding that splits them over the data-parallel axes (None: no backend)."""
    backend = current_backend(raise_exception=False)
    if getattr(backend, "layout", None) is not None:
        return backend.layout.batch
    return backend.jax_device if backend is not None else None


class DataExecutor:
    """Runs a fixed number of steps over a :class:`DataLoader`.

    Iterating the executor yields one batch per step. Around each step it runs the
    queued step closures (one step behind, so the device never waits for the host),
    drains the queue on checkpoint steps and on the final step (so checkpoint closures
    see their own step's state), and draws a progress bar. Under the cstorch alias
    (``cerebrax run``) a step's closures run as cstorch runs them, when the loop moves
    on to the next step, so that they see the Python state of their own step (a
    counter the loop advances, ``executor.iteration``); the host then waits for each
    step before dispatching the next.

    Args:
      dataloader: a cstorch :class:`DataLoader`.
      num_steps: steps to run; defaults to the loader's step count (1 in compile-only
        and validate-only runs).
      checkpoint_steps: ``k`` makes the 0-based steps ``k-1, 2k-1, ...`` and the final
        step checkpoint steps; None takes ``cstorch.configure``'s value; 0 means only
        the final step. A :class:`Schedule` names the 0-based checkpoint steps as
        ranges (the final step is always one too).
      activation_steps: step closures run on steps ``s`` with ``(s + 1) % a == 0`` and
        on the final step; None (cstorch's default) is 1.
      writer: where ``cstorch.summarize_scalar`` / ``summarize_tensor`` write, on
        activation steps, at step ``writer.base_step + iteration`` (see
        :mod:`cerebrax.summaries`): a ``cstorch.utils.tensorboard.SummaryWriter`` or any
        object with ``add_scalar(tag, value, step)`` (and ``add_tensor`` for tensors).
        None drops summaries. The writer is flushed when the loop ends.
      profiler_activities: cstorch's host activities to profile on an appliance;
        cerebrax records them (``executor.profiler.activities``) and measures only the
        rates below.
      progress_bar: False (the default) prints nothing: a script's output is its own, as
        with cstorch. ``"auto"`` (what ``cerebrax fit`` and ``eval`` use; None means the
        same) draws a live bar on stderr when stderr and stdout are a terminal and the
        script shows no progress of its own there (a tqdm bar, a logging handler), and
        otherwise prints one summary line to stderr at the end. True draws a live bar.

    Throughput. ``executor.profiler.rate_tracker.rate`` is the samples (batch rows)
    per second over the last few steps and ``.global_rate`` the samples per second
    since the first step was compiled and dispatched (see :mod:`._profiler`); a step
    closure of step ``s`` sees the samples of steps ``0..s``. After the loop they hold
    the final values.
    """

    def __init__(
        self,
        dataloader: DataLoader,
        num_steps: int | None = None,
        checkpoint_steps: int | None = None,
        activation_steps: int | None = None,
        writer: Any = None,
        profiler_activities: Any = None,
        *,
        progress_bar: bool | str | None = False,
    ):
        # A cstorch DataLoader is what gives its batches per device (the DataLoader, in
        # turn, iterates through a DataExecutor: the module cannot be imported here).
        if not callable(getattr(dataloader, "batches", None)):
            raise ConfigError(
                "DataExecutor expects a cstorch.utils.data.DataLoader, got "
                f"{type(dataloader).__name__}. Wrap the data: "
                "cstorch.utils.data.DataLoader(input_fn, num_steps=...)."
            )
        self.dataloader = dataloader
        backend = current_backend(raise_exception=False)
        self._e2e = backend is None or backend.is_e2e_execution
        if not self._e2e:
            num_steps = 1
        elif num_steps is None:
            num_steps = dataloader.num_steps
        self.num_steps = _check_int("num_steps", num_steps, 1)
        if checkpoint_steps is None:
            checkpoint_steps = run_config().checkpoint_steps
        if not isinstance(checkpoint_steps, Schedule):
            checkpoint_steps = _check_int("checkpoint_steps", checkpoint_steps, 0)
        self.checkpoint_steps: int | Schedule = checkpoint_steps
        self.activation_steps = _check_int(
            "activation_steps", 1 if activation_steps is None else activation_steps, 1)
        self._artifact_dir: pathlib.Path | None = None
        if writer is not None and not callable(getattr(writer, "add_scalar", None)):
            raise ConfigError(
                f"DataExecutor(writer=...) needs an object with add_scalar(tag, value, "
                f"step), got {type(writer).__name__}. Pass "
                "cstorch.utils.tensorboard.SummaryWriter(log_dir)."
            )
        self.writer = writer
        self._progress_bar = progress_bar
        self.iteration = 0
        self.progress: ProgressBar | None = None
        self.profiler = Profiler(profiler_activities)
        self._samples: int = 0  # rows of the batch handed to the running step

    @property
    def artifact_dir(self) -> pathlib.Path:
        """This executor's folder, ``<backend artifact_dir>/executors/NNNNNN`` (numbered
        in order, with a ``latest`` link to the newest), made at the first use, as
        cstorch makes it; Model Zoo writes each loop's ``metadata.json`` there."""
        if self._artifact_dir is None:
            backend = current_backend(raise_exception=False)
            root = pathlib.Path(backend.artifact_dir if backend is not None
                                else "cerebras_logs") / "executors"
            root.mkdir(parents=True, exist_ok=True)
            taken = [int(p.name) for p in root.iterdir() if p.name.isdigit()]
            folder = root / f"{max(taken, default=-1) + 1:06d}"
            folder.mkdir()
            latest = root / "latest"
            if latest.is_symlink() or latest.exists():
                latest.unlink()
            latest.symlink_to(folder.name)
            self._artifact_dir = folder
        return self._artifact_dir

    # ---- step classification -----------------------------------------------------------
    @property
    def user_iteration(self) -> int:
        """The current step, counted from 1 (``iteration + 1``)."""
        return self.iteration + 1

    @property
    def is_initial_step(self) -> bool:
        """Whether the current step is the first one."""
        return self.iteration == 0

    @property
    def on_final_iteration(self) -> bool:
        """Whether the current step is the last one."""
        return self.iteration == self.num_steps - 1

    def is_checkpoint_step(self, step: int | None = None) -> bool:
        """Whether 0-based ``step`` (default: the current one) is a checkpoint step."""
        step = self.iteration if step is None else step
        if step == self.num_steps - 1:
            return True
        k = self.checkpoint_steps
        if isinstance(k, Schedule):
            return k.match(step)
        return k > 0 and (step + 1) % k == 0

    def is_activation_step(self, step: int | None = None) -> bool:
        """Whether 0-based ``step`` (default: the current one) is an activation step:
        one with ``(step + 1) % activation_steps == 0``, or the final step."""
        step = self.iteration if step is None else step
        return step == self.num_steps - 1 or (step + 1) % self.activation_steps == 0

    # ---- the closures' executor protocol (cerebrax._step) -------------------------------
    def should_run(self, step: int, kind: str) -> bool:
        """Whether a closure of ``kind`` called at 0-based ``step`` runs."""
        if not self._e2e:
            return False
        if kind == "checkpoint":
            return self.is_checkpoint_step(step)
        if kind == "summary" and self.writer is None:
            return False
        return self.is_activation_step(step)

    def note_output(self, output: Any) -> None:
        """Shows what a step returned (its loss) in the progress bar."""
        if self.progress is not None:
            self.progress.note_output(output)

    # ---- iteration ------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_steps

    def __iter__(self) -> Iterator[Any]:
        backend = current_backend(raise_exception=False)
        device = batch_placement()
        show = self._progress_bar
        live = None if show in ("auto", None) else show  # ProgressBar's live=None: auto
        self.progress = ProgressBar(self.num_steps, live=live) if show is not False else None
        finished = False
        self.profiler.start()
        with _step.executor_scope(self):
            batches = self.dataloader.batches(device)
            try:
                for step in range(self.num_steps):
                    if step > 0:
                        self._between_steps(step)
                    self.iteration = step
                    batch = self._next_batch(batches, backend)
                    self._samples = self.dataloader.batch_size or 0
                    yield batch
                finished = True
            finally:
                batches.close()  # stops the streaming threads now, not at garbage collection
                self._finish(finished)

    def _finish(self, finished: bool) -> None:
        """Runs the closures left, flushes the writer, closes the progress bar."""
        if _step.current_executor() is not self:
            return  # a newer loop took over: this one's closures were dropped
        try:
            if finished:
                _step.drain(self.num_steps - 2)
                self.profiler.step_done(self._samples)
            _step.drain()
            self.profiler.finish()
            if callable(getattr(self.writer, "flush", None)):
                self.writer.flush()
        finally:
            if self.progress is not None:
                if finished:
                    self.progress.update(self.num_steps)
                self.progress.close()

    @staticmethod
    def _next_batch(batches: Iterator[Any], backend: Any) -> Any:
        try:
            return next(batches)
        except ValueError as e:
            layout = getattr(backend, "layout", None)
            if layout is None or type(e).__name__ != "IndivisibleError":
                raise
            size = layout.wafer.data_parallel_size
            raise ConfigError(
                f"A batch from the DataLoader cannot be split over the {size} "
                f"data-parallel devices of the {layout.wafer.mode!r} layout "
                f"({layout.wafer!r}): {e}. Fix: use a batch size divisible by {size} "
                "(and drop_last=True), or change the ClusterConfig."
            ) from e

    def _between_steps(self, step: int) -> None:
        previous = step - 1
        if step == 1:
            self.profiler.start()  # step 0 is compiled and dispatched: the clock starts
        # Run closures up to step - 2: step - 1 is still computing, keep it busy. cstorch
        # code (the alias) gets cstorch's order instead: a step's closures run before the
        # loop goes on, so they see the Python state of their own step (Model Zoo's
        # Trainer logs under trainer.global_step read in the closure).
        _step.drain(step - (1 if RUNTIME.cstorch_alias else 2))
        self.profiler.step_done(self._samples)  # step - 1 is counted after their closures
        if self.is_checkpoint_step(previous):
            _step.drain()
        if self.progress is not None:
            self.progress.update(step)
