"""``Schedule``: a set of step ranges, for the checkpoint steps of a ``DataExecutor``.

A schedule is a sorted list of non-overlapping ranges; each range matches the steps
``start, start + step, start + 2 * step, ...`` below ``end``, and also ``end - 1`` when
``include_last`` is set. Steps are 0-based, as ``DataExecutor.iteration`` counts them,
so ``checkpoint_steps=k`` over ``n`` steps is the same as
``Schedule([Schedule.Range(k - 1, n, k, include_last=True)])``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from .._filters import check_int, is_strict_int
from ..errors import ConfigError

__all__ = ["Schedule"]


@dataclasses.dataclass
class _Range:
    """The steps ``range(start, end, step)``, plus ``end - 1`` if ``include_last``.

    As cstorch's, a range can be changed after it is made (Cerebras' Model Zoo sets a
    copy's ``start`` to :meth:`next_immediate_step` to count the checkpoints left).

    Args:
      start: the first step (0-based, inclusive).
      end: the step the range stops before (exclusive); larger than ``start``.
      step: the distance between matched steps (at least 1).
      include_last: whether ``end - 1`` matches even when the stride skips it.
    """

    start: int
    end: int
    step: int = 1
    include_last: bool = False

    def __post_init__(self) -> None:
        check_int("Schedule.Range(start=...)", self.start, ge=0)
        if not is_strict_int(self.end) or self.end <= self.start:
            raise ConfigError(
                f"Schedule.Range(end=...) must be an integer larger than start={self.start}, "
                f"got {self.end!r}: the range holds the steps start <= s < end."
            )
        check_int("Schedule.Range(step=...)", self.step, ge=1)
        if not isinstance(self.include_last, bool):
            raise ConfigError(
                f"Schedule.Range(include_last=...) must be True or False, got "
                f"{self.include_last!r}."
            )

    def match(self, index: int) -> bool:
        """Whether 0-based step ``index`` is in this range."""
        if not self.start <= index < self.end:
            return False
        return (index - self.start) % self.step == 0 or (
            self.include_last and index == self.end - 1)

    def __iter__(self) -> Iterator[int]:
        yield from range(self.start, self.end, self.step)
        last = self.end - 1
        if self.include_last and last >= self.start and (last - self.start) % self.step != 0:
            yield last

    def __len__(self) -> int:
        """How many steps match (the strided ones, and ``end - 1`` if it is added)."""
        return sum(1 for _ in self)

    def range(self) -> range:
        """The strided steps, ``range(start, end, step)`` (without ``include_last``)."""
        return range(self.start, self.end, self.step)

    def next_immediate_step(self, index: int) -> int:
        """The first step of the range at or after ``index``; ``end`` where none is left."""
        return next((s for s in self if s >= index), self.end)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Steps given as a list of ranges (``Schedule.Range``), e.g. for checkpoint steps.

    Args:
      intervals: ``Schedule.Range`` objects, sorted and not overlapping.

    Example:
      >>> from cerebrax.utils.data import Schedule
      >>> schedule = Schedule([Schedule.Range(0, 10, 5), Schedule.Range(10, 13)])
      >>> list(schedule), schedule.match(5), schedule.match(6)
      ([0, 5, 10, 11, 12], True, False)
      >>> every_4th = Schedule([Schedule.Range(3, 10, 4, include_last=True)])
      >>> list(every_4th)                  # checkpoint_steps=4 over 10 steps
      [3, 7, 9]
    """

    Range = _Range

    intervals: list[_Range]

    def __post_init__(self) -> None:
        intervals = list(self.intervals)
        for i, interval in enumerate(intervals):
            if not isinstance(interval, _Range):
                raise ConfigError(
                    f"Schedule(intervals=...) takes Schedule.Range objects, got "
                    f"{type(interval).__name__} at position {i}: {interval!r}."
                )
        for first, second in zip(intervals, intervals[1:]):
            if second.start < first.end:
                raise ConfigError(
                    f"Schedule ranges must be sorted and must not overlap, but {second} "
                    f"starts before {first} ends. Order the ranges by start and make each "
                    "start at or after the previous one's end."
                )
        object.__setattr__(self, "intervals", intervals)

    def match(self, index: int) -> bool:
        """Whether 0-based step ``index`` is in one of the ranges."""
        return any(interval.match(index) for interval in self.intervals)

    def __iter__(self) -> Iterator[int]:
        for interval in self.intervals:
            yield from interval

    def range(self) -> list[range]:
        """Each interval's strided steps, as ``range`` objects (without ``include_last``)."""
        return [range(i.start, i.end, i.step) for i in self.intervals]
