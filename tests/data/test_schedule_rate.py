"""Schedule (checkpoint steps as ranges) and the executor's rate tracker.

Rates are checked with a fake clock (exact values from the definitions) and, with the
real clock, against bounds taken around the loop, so no test depends on timing.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cerebrax as cstorch
from cerebrax.data import RateTracker

Schedule = cstorch.utils.data.Schedule
DataLoader = cstorch.utils.data.DataLoader
DataExecutor = cstorch.utils.data.DataExecutor


# ---- Schedule ------------------------------------------------------------------------


@st.composite
def schedules(draw):
    """Sorted, non-overlapping random ranges."""
    ranges, start = [], draw(st.integers(0, 5))
    for _ in range(draw(st.integers(0, 3))):
        end = start + draw(st.integers(1, 12))
        ranges.append(Schedule.Range(start, end, draw(st.integers(1, 5)), draw(st.booleans())))
        start = end + draw(st.integers(0, 4))
    return Schedule(ranges)


@settings(max_examples=60)
@given(schedules())
def test_a_schedule_iterates_exactly_the_steps_it_matches(schedule):
    expected = [
        s for s in range(60)
        if any(r.start <= s < r.end and ((s - r.start) % r.step == 0
                                         or (r.include_last and s == r.end - 1))
               for r in schedule.intervals)
    ]
    assert list(schedule) == expected
    assert [s for s in range(60) if schedule.match(s)] == expected


@settings(max_examples=60)
@given(st.integers(0, 8), st.integers(1, 20), st.integers(1, 6), st.booleans(),
       st.integers(0, 30))
def test_a_range_counts_its_steps_and_finds_the_next_one_as_model_zoo_uses_it(
        start, length, step, include_last, now):
    """Model Zoo's run schedule: ``len(r)``, ``len(r.range())``, and a copy whose ``start``
    is set to ``r.next_immediate_step(global_step)`` counts the checkpoints left."""
    import copy

    r = Schedule.Range(start, start + length, step, include_last)
    matched = [s for s in range(60) if r.match(s)]
    assert len(r) == len(matched) and len(r.range()) == len(range(start, start + length, step))
    left = [s for s in matched if s >= now]
    assert r.next_immediate_step(now) == (left[0] if left else r.end)
    rest = copy.copy(r)
    rest.start = rest.next_immediate_step(now)
    assert len(rest) == len(left) and r.start == start  # the copy changed, not r
    if left:
        assert list(rest) == left


@pytest.mark.parametrize("k, n", [(1, 5), (3, 10), (4, 12), (7, 5)])
def test_an_int_is_the_schedule_of_its_multiples(k, n):
    loader = DataLoader(lambda: [np.zeros(1)], num_steps=n)
    by_int = DataExecutor(loader, checkpoint_steps=k, progress_bar=False)
    schedule = Schedule([Schedule.Range(k - 1, n, k, include_last=True)] if k <= n else [])
    by_schedule = DataExecutor(loader, checkpoint_steps=schedule, progress_bar=False)
    steps = [s for s in range(n) if by_int.is_checkpoint_step(s)]
    assert steps == [s for s in range(n) if by_schedule.is_checkpoint_step(s)]
    assert steps == sorted({*range(k - 1, n, k), n - 1})


def test_checkpoint_closures_run_on_the_schedule_and_the_final_step():
    saved = []

    @cstorch.checkpoint_closure
    def save(step):
        saved.append(step)

    schedule = Schedule([Schedule.Range(0, 4, 2), Schedule.Range(6, 9, 3, include_last=True)])
    loader = DataLoader(lambda: [np.zeros(1)], num_steps=12)
    executor = DataExecutor(loader, checkpoint_steps=schedule, progress_bar=False)
    for _ in executor:
        save(executor.iteration)
    assert saved == [0, 2, 6, 8, 11]


@pytest.mark.parametrize("make, match", [
    (lambda: Schedule.Range(-1, 3), r"start=...\) must be an integer >= 0"),
    (lambda: Schedule.Range(3, 3), "larger than start=3"),
    (lambda: Schedule.Range(0, 3, 0), r"step=...\) must be an integer >= 1"),
    (lambda: Schedule.Range(0, 3, 1, include_last=1), "True or False"),
    (lambda: Schedule([Schedule.Range(0, 5), Schedule.Range(4, 8)]), "must not overlap"),
    (lambda: Schedule([(0, 5, 1)]), "takes Schedule.Range objects"),
    (lambda: DataExecutor(DataLoader(lambda: [1], num_steps=2), checkpoint_steps=1.5),
     "checkpoint_steps"),
])
def test_schedule_errors(make, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        make()


# ---- the rate tracker ------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rates_follow_their_definitions_on_a_fake_clock():
    clock = FakeClock()
    tracker = RateTracker(smoothing=0.5, clock=clock)
    counts, seconds = [10, 10, 30, 10], [1.0, 1.0, 1.0, 4.0]
    avg_c = avg_s = None
    for count, dt in zip(counts, seconds):
        clock.now += dt
        tracker.add(count)
        # ratio of exponential averages (the first count starts both)
        avg_c = count if avg_c is None else avg_c + 0.5 * (count - avg_c)
        avg_s = dt if avg_s is None else avg_s + 0.5 * (dt - avg_s)
        assert tracker.rate == pytest.approx(avg_c / avg_s)
    assert tracker.global_rate == pytest.approx(sum(counts) / sum(seconds))
    tracker.stop()
    clock.now += 100.0  # a stopped tracker no longer changes
    assert tracker.global_rate == pytest.approx(sum(counts) / sum(seconds))
    assert tracker.total_count == 60 and tracker.elapsed_seconds == sum(seconds)


def test_executor_counts_samples_per_step_on_a_fake_clock():
    """Each step's body takes 1 fake second. The clock starts when step 0 is counted
    (its samples took no measured time: counted in the rates, they once made step 0's
    rates B / 0 s and global_rate n * B / (n - 1)); every later step adds B samples in
    1 s, so both rates are B / 1 s, and step 0's closure sees rates of 0."""
    clock, batch, n = FakeClock(), 8, 6
    seen_in_closures = []
    loader = DataLoader(lambda: [np.zeros((batch, 2), np.float32)], num_steps=n)
    executor = DataExecutor(loader, checkpoint_steps=4, progress_bar=False)
    executor.profiler.rate_tracker.clock = clock

    rates_in_closures = []

    @cstorch.step_closure
    def log(step):
        tracker = executor.profiler.rate_tracker
        seen_in_closures.append((step, tracker.total_count))
        rates_in_closures.append((tracker.rate, tracker.global_rate))

    for _ in executor:
        clock.now += 1.0
        log(executor.iteration)
    tracker = executor.profiler.rate_tracker
    assert tracker.total_count == n * batch
    assert tracker.global_rate == pytest.approx(batch / 1.0)
    assert tracker.rate == pytest.approx(batch / 1.0)
    assert rates_in_closures[0] == (0.0, 0.0)
    assert all(0 < r <= 2 * batch and 0 < g <= 2 * batch for r, g in rates_in_closures[1:])
    # A closure of step s (run behind the step, or at once on checkpoint step 3) sees
    # the samples of steps 0..s.
    assert seen_in_closures == [(s, (s + 1) * batch) for s in range(n)]


def test_executor_rates_are_wall_clock_rates():
    """The executor's tracker reads ``time.perf_counter`` (the span it measures is
    checked on a fake clock above); the totals it reports are the samples it saw."""
    batch, n = 4, 5
    loader = DataLoader(lambda: [np.ones((batch, 3), np.float32)], num_steps=n)
    executor = DataExecutor(loader, progress_bar=False)
    assert executor.profiler.rate_tracker.clock is time.perf_counter
    for x in executor:
        (x * 2).block_until_ready()
    assert executor.profiler.rate_tracker.total_count == n * batch
    assert executor.profiler.perf_metrics["total_samples"] == n * batch


# ---- what Model Zoo's Trainer reads ------------------------------------------------------
def test_loaders_have_distinct_ids_that_a_copy_keeps():
    import copy

    first, second = DataLoader(lambda: [np.zeros(1)]), DataLoader(lambda: [np.zeros(1)])
    assert isinstance(first.id, int) and first.id != second.id
    assert copy.copy(second).id == second.id


def test_activation_steps_none_is_every_step():
    loader = DataLoader(lambda: [np.zeros(1)], num_steps=4)
    executor = DataExecutor(loader, activation_steps=None, progress_bar=False)
    assert executor.activation_steps == 1
    assert [executor.is_activation_step(s) for s in range(4)] == [True] * 4


def test_executor_artifact_dirs_are_numbered_under_the_backends_with_latest(tmp_path):
    cstorch.backend("CPU", artifact_dir=str(tmp_path))
    loader = DataLoader(lambda: [np.zeros(1)], num_steps=1)
    first = DataExecutor(loader, progress_bar=False)
    second = DataExecutor(loader, progress_bar=False)
    assert not (tmp_path / "executors").exists()  # made at the first use only
    assert first.artifact_dir == tmp_path / "executors" / "000000"
    assert second.artifact_dir == tmp_path / "executors" / "000001"
    assert first.artifact_dir.is_dir() and first.artifact_dir is first.artifact_dir
    assert (tmp_path / "executors" / "latest").resolve() == second.artifact_dir.resolve()
    (first.artifact_dir / "metadata.json").write_text("{}")  # as Model Zoo writes it


def test_state_dict_counts_the_samples_streamed_as_cstorch_does():
    """Model Zoo's restartable-dataloader callback reads ``samples_streamed``."""
    batches = [np.full((3, 2), i, np.float32) for i in range(10)]
    loader = DataLoader(lambda: batches, num_steps=4)
    assert loader.state_dict()["samples_streamed"] == 0
    for _ in DataExecutor(loader, progress_bar=False):
        pass
    state = loader.state_dict()
    assert state["samples_streamed"] == 4 * 3 == sum(w["samples"] for w in state["workers"])
    resumed = DataLoader(lambda: batches, num_steps=4)
    resumed.load_state_dict(state)  # the extra key is read back without complaint
    assert resumed.state_dict()["samples_streamed"] == 12
