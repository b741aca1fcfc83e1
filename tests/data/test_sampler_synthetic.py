"""DistributedSampler against torch's, SyntheticDataset, and DataLoader.dataloader /
is_restartable."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cerebrax as cstorch  # noqa: E402

dist = cstorch.distributed
DataLoader = cstorch.utils.data.DataLoader
DistributedSampler = cstorch.utils.data.DistributedSampler


def torch_sampler(size, num_replicas, rank, shuffle, seed, drop_last, epoch):
    sampler = torch.utils.data.DistributedSampler(
        range(size), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
        drop_last=drop_last)
    sampler.set_epoch(epoch)
    return sampler


# size, num_replicas, shuffle, seed, drop_last: even and uneven splits, padding that
# wraps around more than once (size < num_replicas), cut tails.
CASES = [
    (12, 3, True, 0, False),
    (10, 3, True, 7, False),
    (10, 3, False, 0, False),
    (10, 4, True, 1, True),
    (2, 5, True, 0, False),
    (11, 1, True, 3, False),
]


@pytest.mark.parametrize("size, replicas, shuffle, seed, drop_last", CASES)
@pytest.mark.parametrize("epoch", [0, 3])
def test_indices_match_torch_distributed_sampler(size, replicas, shuffle, seed, drop_last, epoch):
    for rank in range(replicas):
        ours = DistributedSampler(range(size), replicas, rank, shuffle, seed, drop_last)
        ours.set_epoch(epoch)
        ref = torch_sampler(size, replicas, rank, shuffle, seed, drop_last, epoch)
        assert list(ours) == list(ref)
        assert len(ours) == len(ref)


@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_size_yields_the_batches_of_torch_batch_sampler(drop_last):
    ours = DistributedSampler(range(23), 2, 1, seed=5, drop_last=drop_last, batch_size=4)
    ours.set_epoch(2)
    ref = torch.utils.data.BatchSampler(torch_sampler(23, 2, 1, True, 5, drop_last, 2), 4,
                                        drop_last)
    assert list(ours) == list(ref) and len(ours) == len(ref)


def test_defaults_follow_the_streaming_workers_and_epochs_reshuffle():
    """On a CSX run with 2 x 2 streaming workers each worker's sampler takes its rank's
    share; the DataLoader calls set_epoch, so a worker's second pass draws torch's
    epoch-1 order."""
    cstorch.backend("CSX", cluster_config=dist.ClusterConfig(num_csx=2, num_workers_per_csx=2))
    seen: dict[int, object] = {}

    def input_fn():
        sampler = DistributedSampler(range(16), seed=3, batch_size=2)
        if dist.is_streamer():
            seen[dist.get_streaming_rank()] = sampler
        return torch.utils.data.DataLoader(torch.arange(16), batch_sampler=sampler)

    loader = DataLoader(input_fn, num_steps=8)  # two epochs of every worker
    batches = [np.asarray(b).tolist() for b in loader]
    assert sorted(seen) == [0, 1, 2, 3]
    assert all(s.num_replicas == 4 and s.rank == r for r, s in seen.items())

    def shard(rank, epoch):
        ref = torch_sampler(16, 4, rank, True, 3, False, epoch)
        return [list(b) for b in torch.utils.data.BatchSampler(ref, 2, False)]

    per_rank = {r: shard(r, 0) + shard(r, 1) for r in range(4)}
    # Step s joins batch s // 2 of local worker s % 2 of system 0 (rank s % 2) and of
    # system 1 (rank 2 + s % 2).
    for step, batch in enumerate(batches):
        local, j = step % 2, step // 2
        assert batch == per_rank[local][j] + per_rank[2 + local][j]
    assert shard(0, 0) != shard(0, 1)  # a new order in the second epoch


def test_shard_false_gives_every_worker_all_the_data():
    sampler = DistributedSampler(range(6), shuffle=False, shard=False)
    assert (sampler.num_replicas, sampler.rank, list(sampler)) == (1, 0, list(range(6)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(data_source=iter(range(3))), "needs a dataset with a length"),
    (dict(data_source=range(4), num_replicas=2, rank=2), "out of range"),
    (dict(data_source=range(4), num_replicas=2, shard=False), "shard=False"),
    (dict(data_source=range(4), batch_size=0), r"batch_size=...\) must be an integer >= 1"),
])
def test_sampler_errors(kwargs, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        DistributedSampler(**kwargs)


# ---- SyntheticDataset -------------------------------------------------------------------


def test_synthetic_samples_copy_constants_and_call_callables_with_the_index():
    SyntheticDataset = cstorch.utils.data.SyntheticDataset
    constant = torch.arange(3.0)
    spec = {"x": constant, "pair": (np.ones(2, np.int32), lambda i: torch.tensor([i, -i]))}
    dataset = SyntheticDataset(spec, num_samples=4)
    samples = list(dataset)
    assert len(dataset) == 4 and len(samples) == 4
    for i, sample in enumerate(samples):
        assert torch.equal(sample["x"], constant) and sample["x"] is not constant
        assert torch.equal(sample["pair"][0], torch.ones(2, dtype=torch.int32))
        assert sample["pair"][1].tolist() == [i, -i]
    samples[0]["x"].add_(1)  # samples are copies: the spec is unchanged
    assert torch.equal(constant, torch.arange(3.0))


def test_synthetic_dataset_batches_through_torch_and_cstorch_dataloaders():
    SyntheticDataset = cstorch.utils.data.SyntheticDataset
    spec = (torch.zeros(2), lambda i: torch.tensor(float(i)))
    endless = SyntheticDataset(spec)
    with pytest.raises(TypeError, match="no length"):
        len(endless)
    loader = DataLoader(lambda: torch.utils.data.DataLoader(endless, batch_size=4), num_steps=3)
    batches = [(np.asarray(x), np.asarray(y)) for x, y in loader]
    assert [b[0].shape for b in batches] == [(4, 2)] * 3
    assert np.concatenate([b[1] for b in batches]).tolist() == list(range(12))


@pytest.mark.parametrize("spec, kwargs, match", [
    ([], {}, "holds no tensor"),
    ({"x": 3.0}, {}, "leaves must be torch tensors"),
    (torch.zeros(1), {"num_samples": 0}, r"num_samples=...\) must be an integer > 0"),
])
def test_synthetic_errors(spec, kwargs, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        cstorch.utils.data.SyntheticDataset(spec, **kwargs)


# ---- DataLoader.dataloader and is_restartable ---------------------------------------------


class Restartable:
    def __init__(self):
        self.position = 0

    def __iter__(self):
        return iter([np.zeros(1)] * 2)

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def test_dataloader_attribute_is_the_input_fn_iterable_built_once():
    calls = []

    def input_fn():
        calls.append(1)
        return Restartable()

    loader = DataLoader(input_fn, num_steps=2)
    assert isinstance(loader.dataloader, Restartable) and loader.dataloader is loader.dataloader
    assert loader.is_restartable and calls == [1]
    plain = DataLoader(lambda: [np.zeros(1)], num_steps=1)
    assert len(plain.dataloader) == 1 and not plain.is_restartable


def test_batch_size_is_that_of_the_last_batch_streamed():
    loader = DataLoader(lambda: [np.zeros((3, 2)), np.zeros((3, 5))], num_steps=2)
    assert loader.batch_size is None
    assert [b.shape for b in loader] == [(3, 2), (3, 5)]
    assert loader.batch_size == 3


# ---- num_samples and pad_last, as Model Zoo's H5 map dataset passes them ----------------
@pytest.mark.parametrize("epoch_size", [7, 10, 25])
@pytest.mark.parametrize("replicas", [1, 3])
def test_num_samples_cuts_or_extends_the_epoch_with_copies_of_the_dataset(epoch_size, replicas):
    """The epoch is the dataset's order cut to ``num_samples`` or extended with copies of
    it, then sharded as without it (torch's padding to the replicas applies on top)."""
    epoch = [i % 10 for i in range(epoch_size)]  # the closed form for size 10
    for rank in range(replicas):
        sampler = DistributedSampler(range(10), replicas, rank, shuffle=False,
                                     num_samples=epoch_size)
        padded = (epoch * 2)[:-(-epoch_size // replicas) * replicas]
        assert list(sampler) == padded[rank::replicas] and len(sampler) == len(list(sampler))


def test_pad_last_fills_the_last_batch_with_pad_index():
    from cerebrax.utils.data.sampler import pad_index

    sampler = DistributedSampler(range(10), 1, 0, shuffle=False, batch_size=4, pad_last=True)
    assert list(sampler) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, pad_index, pad_index]]
    assert len(sampler) == 3 and pad_index not in range(10)
    plain = DistributedSampler(range(10), 1, 0, shuffle=False, batch_size=4)
    assert list(plain)[-1] == [8, 9]


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_samples=12, shuffle=True), "shuffles copies of the dataset"),
    (dict(pad_last=True), "needs batch_size"),
    (dict(pad_last=True, batch_size=4, drop_last=True), "drop_last=False"),
    (dict(num_samples=0, shuffle=False), "num_samples"),
])
def test_num_samples_and_pad_last_errors(kwargs, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        DistributedSampler(range(10), 1, 0, **kwargs)
