"""``cstorch.utils.tracker``: ``RateTracker``, samples per second since the start and
smoothed, with cstorch's interface: ``rate()``, ``global_rate()`` and
``elapsed_seconds()`` are methods here (they are properties of
:class:`cerebrax.data.RateTracker`, which this class wraps)."""

from __future__ import annotations

from typing import Any

from ..data import RateTracker as _DataRateTracker

__all__ = ["RateTracker"]


class RateTracker:
    """Counts samples and reports rates, as cstorch's ``RateTracker``.

    Args:
      smoothing, clock: as :class:`cerebrax.data.RateTracker`.

    Example:
      >>> from cerebrax.utils.tracker import RateTracker
      >>> now = [0.0]
      >>> tracker = RateTracker(clock=lambda: now[0])
      >>> now[0] = 2.0; tracker.add(10)
      >>> tracker.total_count, tracker.rate(), tracker.global_rate(), tracker.elapsed_seconds()
      (10, 5.0, 5.0, 2.0)
    """

    def __init__(self, **kwargs: Any) -> None:
        self._tracker = _DataRateTracker(**kwargs)

    def reset(self) -> None:
        """Restarts the clock and the count."""
        self._tracker.reset()

    def add(self, count: int) -> None:
        """Counts ``count`` more samples, done now."""
        self._tracker.add(count)

    def stop(self) -> None:
        """Stops the clock: later rates are up to now."""
        self._tracker.stop()

    @property
    def total_count(self) -> int:
        """Samples counted since the start."""
        return self._tracker.total_count

    def rate(self) -> float:
        """Samples per second, smoothed over the recent counts."""
        return self._tracker.rate

    def global_rate(self) -> float:
        """Samples per second since the start."""
        return self._tracker.global_rate

    def elapsed_seconds(self) -> float:
        """Seconds since the start (or until ``stop()``)."""
        return self._tracker.elapsed_seconds
