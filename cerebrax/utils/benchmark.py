"""``cstorch.utils.benchmark.benchmark_dataloader``: a data loader's throughput, alone.

The benchmark builds the loader with ``input_fn()``, iterates it for a number of epochs
without any model, and records how long building, starting each epoch's iterator and
fetching the batches took, the steps per second (now and then, and overall), and the
distinct batch structures it saw (tree, shapes, dtypes). From those it gives the samples
per second when every batch has the same batch size. A torch DataLoader with workers
gets the same safe worker start method as in a cstorch DataLoader.

    metrics = cstorch.utils.benchmark.benchmark_dataloader(input_fn, num_epochs=2)
    metrics.global_rate          # steps/s over all epochs
    metrics.global_sample_rate   # samples/s, or None for batches of varying size
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import jax
import numpy as np

from .._filters import check_int, is_torch_tensor
from ..data import safe_iter, use_safe_start_method
from ..errors import ConfigError

__all__ = ["BatchMetrics", "BatchSpec", "EpochMetrics", "Metrics", "TensorSpec",
           "benchmark_dataloader"]

# The clock (seconds); tests replace it.
clock: Callable[[], float] = time.perf_counter


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """The shape and dtype of one leaf of a batch (``shape`` None: not an array)."""

    shape: tuple[int, ...] | None
    dtype: str

    @staticmethod
    def of(leaf: Any) -> TensorSpec:
        """The spec of ``leaf``: its shape and dtype for an array or tensor, else its
        type's name with no shape."""
        if is_torch_tensor(leaf) or isinstance(leaf, (np.ndarray, np.generic, jax.Array)):
            return TensorSpec(tuple(int(d) for d in leaf.shape), str(leaf.dtype))
        return TensorSpec(None, type(leaf).__name__)

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}" if self.shape is not None else self.dtype


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    """A batch's structure: the path, shape and dtype of every leaf."""

    leaves: tuple[tuple[str, TensorSpec], ...]

    @staticmethod
    def of(batch: Any) -> BatchSpec:
        """The spec of every leaf of ``batch`` (a pytree; torch tensors are leaves), keyed
        by its path (``batch`` for a batch that is one array)."""
        flat, _ = jax.tree_util.tree_flatten_with_path(batch, is_leaf=is_torch_tensor)
        return BatchSpec(tuple((jax.tree_util.keystr(path) or "batch", TensorSpec.of(leaf))
                               for path, leaf in flat))

    @property
    def batch_size(self) -> int | None:
        """Dim 0 shared by every leaf; None if a leaf is a scalar or they differ."""
        sizes = {spec.shape[0] if spec.shape else None for _, spec in self.leaves}
        return sizes.pop() if len(sizes) == 1 else None

    def __str__(self) -> str:
        return ", ".join(f"{path}: {spec}" for path, spec in self.leaves)


@dataclasses.dataclass
class BatchSpecOccurrence:
    """Where a batch structure first appeared (1-based epoch and step) and how often."""

    epoch: int
    epoch_step: int
    count: int = 1


@dataclasses.dataclass
class BatchMetrics:
    """A sampled step: ``local_rate`` is 1 / (seconds since the batch before), and
    ``global_rate`` the steps per second since the first epoch started (steps/s)."""

    epoch_step: int
    global_step: int
    local_rate: float
    global_rate: float


@dataclasses.dataclass
class EpochMetrics:
    """One epoch: seconds to create its iterator and to fetch its batches."""

    iterator_creation: float = 0.0
    iteration_time: float = 0.0
    total_steps: int = 0
    batch_metrics: list[BatchMetrics] = dataclasses.field(default_factory=list)

    @property
    def total_time(self) -> float:
        """Seconds to create the epoch's iterator plus seconds to fetch its batches."""
        return self.iterator_creation + self.iteration_time


@dataclasses.dataclass
class Metrics:
    """What :func:`benchmark_dataloader` measured (times in seconds, rates in steps/s).

    ``is_partial`` is True when the benchmark was interrupted (Ctrl-C): the metrics
    cover the steps done until then.
    """

    dataloader_build_time: float = 0.0
    epoch_metrics: list[EpochMetrics] = dataclasses.field(default_factory=list)
    batch_specs: dict[BatchSpec, BatchSpecOccurrence] = dataclasses.field(default_factory=dict)
    total_time: float = 0.0
    global_rate: float = 0.0
    is_partial: bool = True

    @property
    def total_steps(self) -> int:
        """Batches fetched over all epochs."""
        return sum(epoch.total_steps for epoch in self.epoch_metrics)

    @property
    def global_sample_rate(self) -> float | None:
        """Samples per second, when every batch had one structure with one batch size."""
        if len(self.batch_specs) != 1:
            return None
        size = next(iter(self.batch_specs)).batch_size
        return None if size is None else self.global_rate * size

    def summary(self) -> str:
        """The metrics as a few lines of text (what ``print_metrics`` prints)."""
        sample_rate = self.global_sample_rate
        lines = [
            "[cerebrax] DataLoader benchmark" + (" (interrupted: partial)" if self.is_partial
                                                 else ""),
            f"  build time: {self.dataloader_build_time:.3f} s",
            f"  steps: {self.total_steps} in {len(self.epoch_metrics)} epoch(s), "
            f"{self.total_time:.3f} s",
            f"  global rate: {self.global_rate:.2f} steps/s"
            + (f", {sample_rate:.2f} samples/s" if sample_rate is not None else ""),
        ]
        for i, epoch in enumerate(self.epoch_metrics, 1):
            lines.append(f"  epoch {i}: {epoch.total_steps} steps, iterator "
                         f"{epoch.iterator_creation:.3f} s, batches {epoch.iteration_time:.3f} s")
        lines.append(f"  batch structures: {len(self.batch_specs)}")
        for spec, seen in self.batch_specs.items():
            lines.append(f"    {seen.count}x (first at epoch {seen.epoch}, step "
                         f"{seen.epoch_step}): {spec}")
        return "\n".join(lines)


def benchmark_dataloader(
    input_fn: Callable[[], Iterable],
    num_epochs: int | None = None,
    steps_per_epoch: int | None = None,
    sampling_frequency: int | None = None,
    profile_activities: list[str] | None = None,
    print_metrics: bool = True,
    *,
    file: TextIO | None = None,
) -> Metrics:
    """Measures how fast the loader ``input_fn()`` yields batches, with no model.

    Args:
      input_fn: builds the loader (a torch DataLoader or any iterable of batches);
        called once, with no arguments.
      num_epochs: passes over the loader (default 1).
      steps_per_epoch: batches per pass (default: the whole loader).
      sampling_frequency: record the rates every this many steps of an epoch, and at
        its first step (default 100; 0: first steps only).
      profile_activities: cstorch's optional host profilers; cerebrax has none yet, so
        only None or an empty list is accepted.
      print_metrics: print :meth:`Metrics.summary` at the end.
      file: where to print (default: ``sys.stdout``).

    Returns:
      The :class:`Metrics`; ``global_rate`` is the steps per second over all epochs
      (iterator creation included), ``global_sample_rate`` the samples per second.

    Raises:
      ConfigError: an argument is out of range, or an epoch yields no batch.
    """
    num_epochs = check_int("benchmark_dataloader(num_epochs=...)", num_epochs, gt=0,
                           optional=True) or 1
    check_int("benchmark_dataloader(steps_per_epoch=...)", steps_per_epoch, gt=0, optional=True)
    frequency = check_int("benchmark_dataloader(sampling_frequency=...)", sampling_frequency,
                          ge=0, optional=True)
    frequency = 100 if frequency is None else frequency
    if profile_activities:
        raise ConfigError(
            f"benchmark_dataloader(profile_activities={profile_activities!r}): cerebrax has "
            "no host activity profilers; drop the argument (the rates and timings are "
            "measured without it)."
        )
    metrics = Metrics()
    try:
        start = clock()
        loader = use_safe_start_method(input_fn())
        metrics.dataloader_build_time = clock() - start
        start = clock()
        global_step = 0
        for epoch in range(1, num_epochs + 1):
            global_step = _run_epoch(loader, epoch, steps_per_epoch, frequency, metrics,
                                     global_step, start)
            metrics.total_time = clock() - start
            metrics.global_rate = global_step / metrics.total_time if metrics.total_time else 0.0
        metrics.is_partial = False
    except KeyboardInterrupt:
        pass  # an interrupted benchmark returns what it measured
    if print_metrics:
        print(metrics.summary(), file=sys.stdout if file is None else file)
    return metrics


def _run_epoch(loader: Any, epoch: int, steps: int | None, frequency: int, metrics: Metrics,
               global_step: int, start: float) -> int:
    """Iterates one epoch into ``metrics``; returns the global step count after it."""
    record = EpochMetrics()
    metrics.epoch_metrics.append(record)
    begin = clock()
    iterator = safe_iter(loader)
    record.iterator_creation = clock() - begin
    begin = last = clock()
    while steps is None or record.total_steps < steps:
        try:
            batch = next(iterator)
        except StopIteration:
            break
        except Exception as error:
            error.add_note(f"[cerebrax] raised by the data loader at epoch {epoch}, step "
                           f"{record.total_steps + 1} (global step {global_step + 1}).")
            raise
        now = clock()
        record.total_steps += 1
        global_step += 1
        step = record.total_steps
        if step == 1 or (frequency and step % frequency == 0):
            record.batch_metrics.append(BatchMetrics(
                step, global_step, 1 / (now - last) if now > last else 0.0,
                global_step / (now - start) if now > start else 0.0))
        spec = BatchSpec.of(batch)
        if spec in metrics.batch_specs:
            metrics.batch_specs[spec].count += 1
        else:
            metrics.batch_specs[spec] = BatchSpecOccurrence(epoch, step)
        record.iteration_time = clock() - begin
        last = clock()
    if record.total_steps == 0:
        raise ConfigError(
            f"benchmark_dataloader: the loader yielded no batch in epoch {epoch}. Check "
            "input_fn (an exhausted iterator yields nothing on its second pass: return a "
            "re-iterable object such as a list or a torch DataLoader)."
        )
    return global_step
