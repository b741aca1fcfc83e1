"""Streaming workers: sharding helpers, order, prefetch, failures, shutdown and resume."""

from __future__ import annotations

import threading
import time
import traceback

import jax
import numpy as np
import pytest

import cerebrax as cstorch
from cerebrax.data import compute_num_steps

dist = cstorch.distributed
DataLoader = cstorch.utils.data.DataLoader


def csx(workers_per_csx: int, num_csx: int = 1) -> None:
    cstorch.backend("CSX", cluster_config=dist.ClusterConfig(
        num_csx=num_csx, num_workers_per_csx=workers_per_csx))


# A deadlock guard, not a speed check: every test here finishes in well under a second
# when it passes, so a thread still running after HANG_S is stuck, whatever the load.
HANG_S = 60


def within(seconds: float, fn, *args):
    """Runs ``fn(*args)`` in a daemon thread; fails the test if it is still running after
    ``seconds`` (a hang)."""
    result: dict = {}

    def body():
        try:
            result["value"] = fn(*args)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            result["error"] = error

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: a hang"
    return result


def streaming_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("cerebrax-")]


def take(iterator, n: int) -> list:
    return [next(iterator) for _ in range(n)]


def sharded_input_fn(num_rows: int, batch_size: int, seed: int = 0):
    """The documented idiom: a disjoint shard per worker, shuffled differently per worker."""
    num_tasks = dist.num_streamers() if dist.is_streamer() else 1
    task_id = dist.get_streaming_rank() if dist.is_streamer() else 0
    rows = np.arange(num_rows)[task_id::num_tasks]
    rows = np.random.default_rng(seed + task_id).permutation(rows)
    per_step = dist.get_streaming_batch_size(batch_size)
    return [rows[i:i + per_step] for i in range(0, len(rows) - per_step + 1, per_step)]


# ---- step counts ---------------------------------------------------------------------------


@pytest.mark.parametrize("args, kwargs, expected", [
    ((10,), dict(initial_step=4, max_steps=10), 6),
    ((10,), dict(initial_step=4, num_steps=3, max_steps=10), 3),
    ((10,), dict(num_epochs=2, grad_accum_steps=3), 6),
    ((10,), dict(num_epochs=2, steps_per_epoch=8, grad_accum_steps=4), 4),
    ((10,), dict(grad_accum_steps=2), 5),
    (([0] * 7,), dict(num_epochs=2), 14),
    ((10, 2), dict(max_steps=5), 3),  # cstorch's positional order: (dataloader, initial_step)
])
def test_step_count_rules(args, kwargs, expected):
    assert compute_num_steps(*args, **kwargs) == expected


@pytest.mark.parametrize("kwargs, match", [
    (dict(initial_step=10, max_steps=10), "max_steps=10 is already reached"),
    (dict(num_epochs=1, steps_per_epoch=2, grad_accum_steps=3), "smaller than grad_accum"),
    (dict(grad_accum_steps=0), "must be an integer > 0"),
    (dict(initial_step=-1, num_steps=2), "must be an integer >= 0"),
    (dict(max_steps=True), "must be an integer > 0"),
])
def test_step_count_errors(kwargs, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        compute_num_steps(10, **kwargs)


def test_step_count_of_a_dataloader_uses_the_length_of_its_data():
    loader = DataLoader(lambda: [np.zeros(2)] * 6, num_steps=100)
    assert compute_num_steps(loader, num_epochs=2) == 12
    assert len(loader) == 100


# ---- sharding helpers ---------------------------------------------------------------------


def test_helpers_without_csx_workers_describe_one_streamer():
    seen = {}

    def input_fn():
        seen.update(streamers=dist.num_streamers(), rank=dist.get_streaming_rank(),
                    streamer=dist.is_streamer(), bs=dist.get_streaming_batch_size(8),
                    tasks=dist.num_tasks(), ordinal=dist.get_ordinal(),
                    master=dist.is_master_ordinal(), receivers=dist.num_receivers(),
                    thread=threading.current_thread().name)
        return [np.zeros(2)]

    list(DataLoader(input_fn, num_steps=2))
    assert seen == dict(streamers=1, rank=0, streamer=True, bs=8, tasks=1, ordinal=0,
                        master=True, receivers=1, thread="MainThread")


def test_helpers_in_csx_workers_and_on_the_user_node():
    csx(workers_per_csx=2, num_csx=2)
    seen = {}
    lock = threading.Lock()

    def input_fn():
        info = (dist.num_streamers(), dist.is_streamer(), dist.get_streaming_batch_size(5),
                dist.num_tasks(), dist.get_ordinal(), dist.num_receivers())
        rank = dist.get_streaming_rank() if dist.is_streamer() else "user"
        with lock:
            seen[rank] = info
        return [np.zeros((dist.get_streaming_batch_size(5), 1))] * 4

    loader = DataLoader(input_fn, num_steps=2)
    assert len(loader) == 2  # the user node's copy is built for the length
    assert [b.shape for b in loader] == [(5, 1), (5, 1)]  # 3 + 2 rows: the global batch
    assert seen == {
        "user": (4, False, 5, 5, 0, 2),
        0: (4, True, 3, 5, 1, 2), 1: (4, True, 3, 5, 2, 2),
        2: (4, True, 2, 5, 3, 2), 3: (4, True, 2, 5, 4, 2),
    }
    with pytest.raises(cstorch.StateError, match="is_streamer"):
        dist.get_streaming_rank()


@pytest.mark.parametrize("workers", [2, 4])
def test_workers_stream_disjoint_shards_that_cover_the_data(workers):
    csx(workers_per_csx=workers)
    loader = DataLoader(sharded_input_fn, 96, 4, seed=7, num_epochs=1)
    assert len(loader) == 24  # the user node sees all 96 rows
    rows = np.concatenate([np.asarray(b) for b in loader])
    assert sorted(rows.tolist()) == list(range(96))
    # Step s came from worker s % workers, whose rows are rank::workers.
    steps = rows.reshape(24, 4)
    assert [int(s[0]) % workers for s in steps] == [s % workers for s in range(24)]


def test_workers_with_the_same_seed_shuffle_differently():
    csx(workers_per_csx=2)
    loader = DataLoader(lambda: np.random.default_rng(
        3 + dist.get_streaming_rank()).permutation(8).reshape(4, 2) if dist.is_streamer()
        else np.zeros((4, 2)), num_steps=8)
    batches = [np.asarray(b).tolist() for b in loader]
    assert batches[0::2] != batches[1::2]  # worker 0's epoch vs worker 1's
    assert sorted(sum(batches[0::2], [])) == sorted(sum(batches[1::2], [])) == list(range(8))


def test_round_robin_order_is_deterministic():
    csx(workers_per_csx=3)

    def input_fn():
        rank = dist.get_streaming_rank() if dist.is_streamer() else -1
        time.sleep(0.01 * (3 - rank) if rank >= 0 else 0)  # worker 0 is ready last
        return [np.array([rank, i]) for i in range(4)]

    runs = [[tuple(np.asarray(b).tolist()) for b in DataLoader(input_fn, num_steps=12)]
            for _ in range(2)]
    assert runs[0] == runs[1] == [(s % 3, s // 3) for s in range(12)]


# ---- conversion and placement ---------------------------------------------------------------


def test_torch_batches_in_nested_structures_are_placed_on_the_sharding():
    torch = pytest.importorskip("torch")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    batch = {"x": torch.ones(2, 3, dtype=torch.bfloat16),
             "y": (np.arange(2), jax.numpy.zeros(2)), "n": 3}
    stream = DataLoader(lambda: [batch]).batches(sharding)
    got = next(stream)
    stream.close()
    assert got["x"].dtype == jax.numpy.bfloat16 and got["x"].sharding == sharding
    assert got["y"][0].sharding == sharding and got["y"][1].sharding == sharding
    assert got["n"] == 3


@pytest.mark.parametrize("seeded", [True, False])
def test_torch_dataloader_input_fn_with_and_without_generator_seeds(seeded):
    torch = pytest.importorskip("torch")
    csx(workers_per_csx=2)

    def input_fn(seed):
        task_id = dist.get_streaming_rank() if dist.is_streamer() else 0
        num_tasks = dist.num_streamers() if dist.is_streamer() else 1
        shard = torch.utils.data.Subset(torch.arange(40), range(task_id, 40, num_tasks))
        generator = torch.Generator().manual_seed(seed + task_id) if seeded else None
        return torch.utils.data.DataLoader(shard, batch_size=4, shuffle=True,
                                           generator=generator, drop_last=True)

    def run():
        return [np.asarray(b).tolist() for b in DataLoader(input_fn, 5, num_epochs=2)]

    first = run()
    assert len(first) == 20
    for epoch in (first[:10], first[10:]):  # every epoch covers the data once
        assert sorted(sum(epoch, [])) == list(range(40))
    if seeded:
        assert run() == first


# ---- errors ---------------------------------------------------------------------------------


def test_a_ragged_batch_names_the_shapes_and_drop_last():
    torch = pytest.importorskip("torch")
    dataset = torch.utils.data.TensorDataset(torch.zeros(10, 1), torch.zeros(10))
    loader = DataLoader(lambda: torch.utils.data.DataLoader(dataset, batch_size=4), num_steps=3)
    got = []
    with pytest.raises(cstorch.ConfigError, match="drop_last=True") as info:
        for batch in loader:
            got.append(batch)
    assert len(got) == 2  # the error comes at the ragged batch, not before
    assert "batch[0]: first batch (4, 1), this batch (2, 1)" in str(info.value)
    assert "batch[1]: first batch (4,), this batch (2,)" in str(info.value)


def test_a_ragged_worker_is_an_error_on_csx_too():
    csx(workers_per_csx=2)
    loader = DataLoader(lambda: [np.zeros((3 if dist.get_streaming_rank() else 4, 2))]
                        if dist.is_streamer() else [np.zeros((4, 2))], num_steps=4)
    with pytest.raises(cstorch.ConfigError, match=r"Batch 1 .*\n.*\(4, 2\), this batch \(3, 2\)"):
        list(loader)


class Boom(RuntimeError):
    pass


def test_input_fn_raising_at_build_time_reaches_the_step_at_its_first_batch():
    csx(workers_per_csx=2)

    def input_fn():
        if dist.is_streamer() and dist.get_streaming_rank() == 1:
            raise Boom("no data for worker 1")
        return [np.zeros(2)] * 3

    got = []

    def run():
        for batch in DataLoader(input_fn, num_steps=6):
            got.append(batch)

    result = within(HANG_S, run)
    error = result["error"]
    # Batches go round the workers: worker 1's failure arrives in place of step 1's batch,
    # not after worker 0's data runs out.
    assert isinstance(error, Boom) and len(got) <= 1, len(got)
    assert any("streaming worker 1 of 2" in note for note in error.__notes__)
    assert "in input_fn" in "".join(traceback.format_exception(error))
    assert not streaming_threads()


def test_an_error_mid_iteration_arrives_where_its_batch_would_have():
    def input_fn():
        def gen():
            for i in range(3):
                yield np.full(2, i)
            raise Boom("corrupt record 3")

        class Data:
            def __iter__(self):
                return gen()
        return Data()

    got = []

    def run():
        for batch in DataLoader(input_fn, num_steps=5):
            got.append(int(batch[0]))

    result = within(HANG_S, run)
    assert isinstance(result["error"], Boom) and got == [0, 1, 2]
    assert "corrupt record 3" in str(result["error"])
    assert not streaming_threads()


def test_an_empty_or_exhausted_input_fn_is_an_error():
    with pytest.raises(cstorch.ConfigError, match="produced no batches"):
        list(DataLoader(lambda: [], num_steps=2))
    with pytest.raises(cstorch.ConfigError, match="exhausted after one pass"):
        list(DataLoader(lambda: iter([np.zeros(1)] * 2), num_steps=3))
    assert len(list(DataLoader(lambda: iter([np.zeros(1)] * 2), num_steps=2))) == 2


# ---- shutdown and prefetch ------------------------------------------------------------------


def test_an_early_break_stops_every_worker_thread():
    csx(workers_per_csx=3)
    endless = lambda: [np.zeros(2)] * 1000  # noqa: E731
    for i, _ in enumerate(DataLoader(endless, num_steps=1000)):
        if i == 2:
            break
    assert not streaming_threads()
    stream = DataLoader(endless).batches()
    take(stream, 2)
    assert len(streaming_threads()) == 4  # 3 workers + the feeder
    stream.close()
    assert not streaming_threads()


def test_prefetching_reads_the_next_batch_while_a_step_runs():
    """The input is read ahead in the background: each step waits, inside its body, for
    the next batch to have been read. A loader that reads only between steps never gets
    there (the wait runs into the hang guard)."""
    read = [threading.Event() for _ in range(12)]

    def input_fn():
        class Data:
            def __iter__(self):
                for i in range(12):
                    read[i].set()
                    yield np.full(4, i)
        return Data()

    loader = DataLoader(input_fn, num_steps=12)
    loader.background = True  # a slow, waiting input pipeline: stream it in a thread
    for step, batch in enumerate(loader):
        assert int(batch[0]) == step
        if step + 1 < 12:
            assert read[step + 1].wait(HANG_S), f"batch {step + 1} not read during step {step}"


def reading_threads_input_fn(readers: set, check=None):
    """An input_fn of 4 batches that records the threads reading them (and checks
    ``check()`` on each read)."""

    def input_fn():
        class Data:
            def __iter__(self):
                for i in range(4):
                    readers.add(threading.current_thread().name)
                    assert check is None or check()
                    yield np.full(2, i)
        return Data()

    return input_fn


def test_one_streamer_on_an_accelerator_streams_in_a_background_thread(monkeypatch):
    from cerebrax.data import _dataloader

    monkeypatch.setattr(_dataloader, "_platform", lambda placement: "gpu")
    readers = set()
    stream = DataLoader(reading_threads_input_fn(readers)).batches()
    assert [int(b[0]) for b in take(stream, 5)] == [0, 1, 2, 3, 0]
    assert len(streaming_threads()) == 2  # the streamer and the feeder
    stream.close()
    assert readers == {"cerebrax-streamer-0"} and not streaming_threads()


def test_one_streamer_reads_in_the_stepping_thread_without_threads():
    readers = set()
    no_threads = lambda: not streaming_threads()  # noqa: E731
    got = [int(b[0]) for b in DataLoader(reading_threads_input_fn(readers, no_threads),
                                         num_steps=10)]
    assert got == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert readers == {"MainThread"}


def test_two_workers_stream_in_parallel():
    """Both workers are inside their input at once: each one's first read waits for the
    other's to begin. Workers that took turns would never meet (the barrier breaks)."""
    csx(workers_per_csx=2)
    both_reading = threading.Barrier(2, timeout=HANG_S)

    def input_fn():
        class Data:
            def __iter__(self):
                for i in range(8):
                    if i == 0:
                        both_reading.wait()
                    yield np.full(4, i)
        return Data()

    got = within(HANG_S, lambda: [int(b[0]) for b in DataLoader(input_fn, num_steps=16)])
    assert "error" not in got, got.get("error")
    assert sorted(got["value"]) == sorted(list(range(8)) * 2)
    assert not both_reading.broken


# ---- resume -----------------------------------------------------------------------------------


def torch_shuffled(seed: int = 0):
    import torch

    task_id = dist.get_streaming_rank() if dist.is_streamer() else 0
    data = torch.arange(24).reshape(12, 2)
    return torch.utils.data.DataLoader(
        data, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(seed + task_id))


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_from_a_state_dict_reproduces_the_batches(workers, tmp_path):
    pytest.importorskip("torch")
    csx(workers_per_csx=workers)  # 0: one streamer, the main thread's iterable
    full = [np.asarray(b).tolist() for b in DataLoader(torch_shuffled, num_steps=19)]
    for stop in (1, 5, 8, 13):
        loader = DataLoader(torch_shuffled, num_steps=stop)
        head = [np.asarray(b).tolist() for b in loader]
        cstorch.save({"dataloader": loader.state_dict()}, tmp_path / "ckpt.mdl")
        resumed = DataLoader(torch_shuffled, num_steps=19 - stop)
        resumed.load_state_dict(cstorch.load(tmp_path / "ckpt.mdl")["dataloader"])
        tail = [np.asarray(b).tolist() for b in resumed]
        assert head + tail == full, stop
        assert resumed.state_dict()["steps"] == 19


def test_state_dict_counts_consumed_batches_not_prefetched_ones():
    csx(workers_per_csx=2)
    loader = DataLoader(lambda: [np.zeros(2)] * 3, num_steps=100)
    stream = loader.batches()
    take(stream, 5)
    time.sleep(0.05)  # the workers run ahead
    state = loader.state_dict()
    assert state["steps"] == 5
    assert [(w["epoch"], w["position"], w["batches"]) for w in state["workers"]] == [
        (0, 3, 3), (0, 2, 2)]
    with pytest.raises(cstorch.StateError, match="while the loader is being iterated"):
        loader.load_state_dict(state)
    stream.close()


@pytest.mark.parametrize("strict", [True, False])
def test_load_state_dict_takes_cstorchs_strict_and_still_resumes_exactly(strict):
    """cstorch's ``load_state_dict(state_dict, strict=...)`` (Model Zoo's Trainer passes it):
    either way the batches continue where the state was saved, and a state that cannot be
    resumed exactly is refused, never loosely applied."""
    full = [np.asarray(b).tolist() for b in DataLoader(lambda: np.arange(8.0), num_steps=6)]
    loader = DataLoader(lambda: np.arange(8.0), num_steps=2)
    head = [np.asarray(b).tolist() for b in loader]
    resumed = DataLoader(lambda: np.arange(8.0), num_steps=4)
    resumed.load_state_dict(loader.state_dict(), strict=strict)
    assert head + [np.asarray(b).tolist() for b in resumed] == full
    with pytest.raises(cstorch.ConfigError, match="expects the dict"):
        resumed.load_state_dict({"steps": 3}, strict=strict)


def test_resume_needs_the_same_streaming_layout():
    state = DataLoader(lambda: [np.zeros(1)]).state_dict()
    cstorch.reset()
    csx(workers_per_csx=2)
    loader = DataLoader(lambda: [np.zeros(1)], num_steps=2)
    loader.load_state_dict(state)
    with pytest.raises(cstorch.ConfigError, match="num_workers_per_csx=1 workers, but this run"):
        list(loader)
    with pytest.raises(cstorch.ConfigError, match="expects the dict"):
        loader.load_state_dict({"steps": 3})


class Counter:
    """A restartable iterable: resumes from its own state, never replays."""

    def __init__(self, n: int):
        self.n, self.next_value, self.loaded, self.worker_steps = n, 0, None, []

    def __iter__(self):
        while self.next_value < self.n:
            self.next_value += 1
            yield np.full(2, self.next_value - 1)
        self.next_value = 0

    def state_dict(self):
        self.worker_steps.append(dist.get_worker_state().worker_step)
        return {"next_value": self.next_value}

    def load_state_dict(self, state):
        assert dist.get_worker_state().user_state_dict == state
        self.loaded = dict(state)
        self.next_value = state["next_value"]


def test_a_restartable_iterable_is_restored_from_its_own_state():
    assert isinstance(Counter(1), cstorch.utils.data.RestartableDataLoader)
    made = []

    def input_fn():
        made.append(Counter(5))
        return made[-1]

    loader = DataLoader(input_fn, num_steps=7)
    assert [int(b[0]) for b in loader] == [0, 1, 2, 3, 4, 0, 1]
    state = loader.state_dict()
    assert state["workers"][0]["user_state"] == {"next_value": 2}
    assert made[0].worker_steps[:7] == [1, 2, 3, 4, 5, 6, 7]
    resumed = DataLoader(input_fn, num_steps=4)
    resumed.load_state_dict(state)
    assert [int(b[0]) for b in resumed] == [2, 3, 4, 0]
    assert made[1].loaded == {"next_value": 2}
    with pytest.raises(cstorch.StateError, match="only available inside"):
        dist.get_worker_state()


class AggregatingLoader:
    """cstorch's restartable protocol as Model Zoo's restartable loader has it: the state it
    loads is the aggregate of all workers' states (``aggregate_state_dict``), in a format
    of its own; a worker's own ``state_dict()`` is refused by its ``load_state_dict``."""

    def __init__(self, n: int, seed: int):
        self.order = np.random.default_rng(seed).permutation(n)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        for i in self.order:
            yield np.full(2, 100 * self.epoch + i)

    def state_dict(self):
        return {"samples_streamed": dist.get_worker_state().samples_streamed}

    def load_state_dict(self, state_dict, strict=True):
        if strict and "__version__" not in state_dict:
            raise KeyError("the state is not an aggregated state")

    def aggregate_state_dict(self, worker_states):
        return {"__version__": 1, "samples_streamed": sum(
            s["samples_streamed"] for s in worker_states)}

    def deaggregate_state_dict(self, aggregated_state_dict, strict=True):
        return aggregated_state_dict


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_of_cstorchs_aggregated_protocol_resumes_with_the_uninterrupted_batches(
        workers):
    """cerebrax does not build cstorch's aggregated state, so it does not hand such a
    loader a state: it replays the consumed batches, and the resumed run sees the batches
    of the run never stopped."""
    csx(workers_per_csx=workers)

    def input_fn():
        return AggregatingLoader(5, seed=dist.get_streaming_rank() if dist.is_streamer() else 0)

    full = [np.asarray(b).tolist() for b in DataLoader(input_fn, num_steps=12)]
    for stop in (3, 7):
        loader = DataLoader(input_fn, num_steps=stop)
        head = [np.asarray(b).tolist() for b in loader]
        resumed = DataLoader(input_fn, num_steps=12 - stop)
        resumed.load_state_dict(loader.state_dict(), strict=True)
        assert head + [np.asarray(b).tolist() for b in resumed] == full, stop


def test_a_checkpoint_closure_saves_the_state_of_its_own_step():
    csx(workers_per_csx=2)
    full = [np.asarray(b).tolist() for b in DataLoader(sharded_input_fn, 40, 2, num_steps=10)]
    saved = {}

    @cstorch.checkpoint_closure
    def save(step):
        saved[step] = loader.state_dict()

    loader = DataLoader(sharded_input_fn, 40, 2, num_steps=10)
    executor = cstorch.utils.data.DataExecutor(loader, checkpoint_steps=4, progress_bar=False)
    for _ in executor:
        save(executor.iteration)
    assert {step: state["steps"] for step, state in saved.items()} == {3: 4, 7: 8, 9: 10}
    resumed = DataLoader(sharded_input_fn, 40, 2, num_steps=6)
    resumed.load_state_dict(saved[3])
    assert [np.asarray(b).tolist() for b in resumed] == full[4:]
