"""The DataExecutor's throughput: ``executor.profiler.rate_tracker``.

The executor counts the samples (batch rows) of every step and the tracker turns the
counts into two rates, in samples per second:

- ``rate``: smoothed over the last few steps, ``ema(samples) / ema(seconds)`` with the
  per-step weight ``smoothing`` (a ratio of averages, so one step that happened to
  return quickly does not make the rate jump);
- ``global_rate``: every sample counted since the start over the seconds since then.

When counts happen. The executor counts a step's samples once its Python body has
returned and the closures of the steps before it have run, so a step closure of step
``s`` (the usual place to log rates) sees the samples of steps ``0..s``. The clock
starts when the first step has been traced, compiled, dispatched and counted (compile
time is not throughput): the first step's samples are in ``total_count`` but not in the
rates, which are 0 in its closure and measure the steps after it. When the loop ends it waits for the last step and stops the clock, so the
rates read after the loop are final. Time comes from ``clock`` (``time.perf_counter``);
tests give a fake one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax

from .._runtime import RUNTIME
from ..errors import ConfigError

__all__ = ["Profiler", "RateTracker"]


class RateTracker:
    """Samples per second, smoothed (``rate``) and since the start (``global_rate``).

    Args:
      smoothing: the weight of the newest count in the averages (0 < smoothing <= 1;
        1 is the last count over the time since the one before).
      clock: returns the time in seconds.

    Example:
      >>> from cerebrax.data import RateTracker
      >>> now = [0.0]                                  # a fake clock, in seconds
      >>> tracker = RateTracker(clock=lambda: now[0])
      >>> for _ in range(4):                           # 8 samples every 0.5 s
      ...     now[0] += 0.5
      ...     tracker.add(8)
      >>> tracker.rate, tracker.global_rate
      (16.0, 16.0)
    """

    def __init__(self, *, smoothing: float = 0.2, clock: Callable[[], float] = time.perf_counter):
        if not 0 < smoothing <= 1:
            raise ConfigError(f"RateTracker(smoothing=...) must be in (0, 1], got {smoothing!r}.")
        self.smoothing = smoothing
        self.clock = clock
        self.reset()

    def reset(self, counted: int = 0) -> None:
        """Restarts the clock. ``counted``: samples already done when it starts; they
        count in ``total_count`` but in neither rate (they took no measured time)."""
        self.start = self._last = self.clock()
        self.total_count = self._before = counted
        self._end: float | None = None
        self._avg_count = self._avg_seconds = 0.0

    def add(self, count: int) -> None:
        """Counts ``count`` samples done now."""
        now = self.clock()
        seconds, self._last = now - self._last, now
        self.total_count += count
        if self._avg_seconds == 0.0 and seconds <= 0:
            return  # nothing to average yet: the samples count in the total only
        a = self.smoothing if self._avg_seconds else 1.0
        self._avg_count += a * (count - self._avg_count)
        self._avg_seconds += a * (seconds - self._avg_seconds)

    def stop(self) -> None:
        """Stops the clock: the rates no longer change."""
        if self._end is None:
            self._end = self.clock()

    @property
    def elapsed_seconds(self) -> float:
        """Seconds since the start (until :meth:`stop` once stopped)."""
        end = self.clock() if self._end is None else self._end
        return end - self.start

    @property
    def rate(self) -> float:
        """Samples per second over the last few counts (0 before two counts)."""
        if self._avg_seconds <= 0:
            return 0.0
        return self._avg_count / self._avg_seconds

    @property
    def global_rate(self) -> float:
        """Samples per second since the start."""
        elapsed = self.elapsed_seconds
        return (self.total_count - self._before) / elapsed if elapsed > 0 else 0.0


class Profiler:
    """What a ``DataExecutor`` measures while its loop runs (``executor.profiler``).

    Args:
      activities: cstorch's ``profiler_activities`` (host activities of a Cerebras
        appliance); cerebrax has none to profile and records them only.
      clock: the clock of :attr:`rate_tracker`.

    Example:
      >>> from cerebrax.utils.data import DataExecutor, DataLoader
      >>> loader = DataLoader(lambda: [np.ones((4, 3), np.float32)], num_steps=5)
      >>> executor = DataExecutor(loader)
      >>> for batch in executor:
      ...     pass
      >>> metrics = executor.profiler.perf_metrics     # 5 steps of 4 samples
      >>> metrics["total_samples"], sorted(metrics)
      (20, ['global_rate', 'rate', 'total_samples', 'total_time'])
    """

    def __init__(self, activities: Any = None, *, clock: Callable[[], float] = time.perf_counter):
        self.activities = activities
        self.rate_tracker = RateTracker(clock=clock)

    def start(self) -> None:
        """The first step is dispatched: the clock starts at its count (see below)."""
        self.rate_tracker.reset()
        self._first = True

    def step_done(self, samples: int) -> None:
        """Counts a step of ``samples`` samples (batch rows) as done now.

        The first step after :meth:`start` restarts the clock instead: its samples
        count in the total, not in the rates.
        """
        if getattr(self, "_first", False):
            # The first step is counted as soon as it is dispatched, no measurable time
            # after the clock started: its samples start the clock (they count in the
            # total, not in the rates; counted, they made step 1's rates ~1e5 samples/s).
            self._first = False
            self.rate_tracker.reset(counted=samples)
            return
        self.rate_tracker.add(samples)

    def finish(self) -> None:
        """The loop ended: waits for the last step, then stops the clock."""
        arrays = [x for x in RUNTIME.last_outputs
                  if isinstance(x, jax.Array) and not x.is_deleted()]
        # Host sync point: the final rates cover the last step's computation.
        jax.block_until_ready(arrays)
        self.rate_tracker.stop()

    @property
    def perf_metrics(self) -> dict[str, float]:
        """``total_samples``, ``total_time``, ``rate`` and ``global_rate``."""
        tracker = self.rate_tracker
        return {"total_samples": tracker.total_count, "total_time": tracker.elapsed_seconds,
                "rate": tracker.rate, "global_rate": tracker.global_rate}
