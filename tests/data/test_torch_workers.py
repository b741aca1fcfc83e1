"""Multi-worker torch DataLoaders through the cstorch DataLoader: a start method that is
safe beside JAX's threads, the same batches, no fork warning, and a clear error for a
dataset that cannot be sent to the workers."""

from __future__ import annotations

import multiprocessing
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cerebrax as cstorch  # noqa: E402
from cerebrax.data import use_safe_start_method  # noqa: E402
from torch_datasets import squares_loader  # noqa: E402

SAFE = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def test_two_worker_loader_gives_the_torch_batches_without_a_fork_warning():
    jnp.zeros(1).block_until_ready()  # JAX's runtime (and its at-fork warning) is live
    loader = cstorch.utils.data.DataLoader(squares_loader, 12, 3, num_workers=2, num_steps=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [(np.asarray(x), np.asarray(w)) for x, w in loader]
    assert [str(w.message) for w in caught] == []
    expected = [x.numpy() for x, _ in squares_loader(12, 3, num_workers=0)]
    np.testing.assert_array_equal(np.stack([x for x, _ in got]), np.stack(expected))
    assert {int(w[0]) for _, w in got} == {0, 1}  # both worker processes loaded batches
    assert loader.dataloader.multiprocessing_context.get_start_method() == SAFE


def test_a_start_method_the_user_chose_is_kept_and_single_process_loaders_untouched():
    chosen = squares_loader(8, 2, num_workers=2, multiprocessing_context="spawn")
    assert use_safe_start_method(chosen).multiprocessing_context.get_start_method() == "spawn"
    single = squares_loader(8, 2, num_workers=0)
    assert use_safe_start_method(single).multiprocessing_context is None
    assert use_safe_start_method([1, 2]) == [1, 2]


def test_an_unpicklable_dataset_names_the_fix():
    class Local(torch.utils.data.Dataset):  # defined in a function: not picklable
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return torch.zeros(2)

    loader = cstorch.utils.data.DataLoader(
        lambda: torch.utils.data.DataLoader(Local(), batch_size=2, num_workers=2), num_steps=1)
    with pytest.raises(cstorch.ConfigError, match="at module level") as info:
        list(loader)
    message = str(info.value)
    assert f"multiprocessing_context={SAFE!r}" in message
    assert "num_workers=0" in message and 'multiprocessing_context="fork"' in message


def test_workers_kept_to_the_end_are_stopped_at_exit_while_their_queues_still_work():
    # persistent_workers keeps the iterator (and its workers) on the torch loader for the
    # next epoch, so they live until the interpreter exits; stopped only by the loader's
    # __del__ during teardown, each worker waited out a 5 s timeout (a script hung ~15 s
    # after its last step). cerebrax's exit hook stops them while multiprocessing works.
    from cerebrax.data import _torch_workers

    loader = cstorch.utils.data.DataLoader(squares_loader, 12, 3, num_workers=2,
                                           persistent_workers=True, num_steps=2)
    assert len(list(loader)) == 2
    iterator = loader.dataloader._iterator
    assert iterator is not None and all(w.is_alive() for w in iterator._workers)
    _torch_workers.shutdown_workers()
    assert not any(w.is_alive() for w in iterator._workers)  # joined, not killed
    assert all(w.exitcode == 0 for w in iterator._workers)
