"""Lazy loading: ``cerebrax.ckpt.load`` reads metadata only; arrays are read when used."""

from __future__ import annotations

import copy
import gc
import pickle
import threading
from pathlib import Path

import chex
import h5py
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import cerebrax as cstorch
import cerebrax.ckpt as ckpt
from cerebrax._runtime import RUNTIME
from cerebrax.ckpt import _lazy, _save, _seal
from cerebrax.errors import CheckpointError


def _state() -> dict:
    rng = np.random.default_rng(0)
    return {
        "model": {"w": rng.normal(size=(3, 4)).astype(np.float32),
                  "b": jnp.arange(4, dtype=jnp.bfloat16)},
        "optimizer": {"state": {0: {"step": np.float32(3.0)}}, "lr": 0.1},
        "big": rng.normal(size=(3 << 17) + 5),  # several digest blocks and a tail
    }


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict]:
    state = _state()
    ckpt.save(state, tmp_path / "c.h5")
    return tmp_path / "c.h5", state


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    original = _lazy.Source._read_locked

    def counting(self: _lazy.Source, info: _lazy.ArrayInfo) -> np.ndarray:
        reads.append(info.key)
        return original(self, info)

    monkeypatch.setattr(_lazy.Source, "_read_locked", counting)
    return reads


def _open_sources() -> int:
    gc.collect()
    return sum(1 for s in RUNTIME.open_checkpoints if s._finalizer.alive)


def test_load_reads_no_array_data(saved, monkeypatch: pytest.MonkeyPatch) -> None:
    path, state = saved
    reads = _count_reads(monkeypatch)
    monkeypatch.setattr(h5py.h5d, "open", None)  # any dataset access would fail
    tree = ckpt.load(path)
    w = tree["model"]["w"]
    assert (w.shape, w.dtype, w.ndim, w.size, w.nbytes) == ((3, 4), np.float32, 2, 12, 48)
    assert tree["model"]["b"].dtype == ml_dtypes.bfloat16
    assert tree["optimizer"]["state"][0]["step"].shape == ()
    assert len(tree["big"]) == (3 << 17) + 5
    assert w.key == "model.w" and w.filename == str(path)
    assert "model.w" in repr(w) and "float32" in repr(w)
    assert reads == []


def test_each_use_reads_and_returns_the_saved_values(saved, monkeypatch) -> None:
    path, state = saved
    reads = _count_reads(monkeypatch)
    tree = ckpt.load(path)
    np.testing.assert_array_equal(np.asarray(tree["big"]), state["big"])
    np.testing.assert_array_equal(np.asarray(tree["big"]), state["big"])
    assert reads == ["big", "big"]  # nothing is cached
    step = tree["optimizer"]["state"][0]["step"].numpy()
    assert type(step) is np.float32 and step == 3.0


def test_lazy_arrays_act_like_arrays(saved) -> None:
    path, state = saved
    w, b = ckpt.load(path)["model"].values()
    want = state["model"]["w"]
    np.testing.assert_array_equal(w * 2 + 1, want * 2 + 1)
    np.testing.assert_array_equal(1 - w, 1 - want)
    np.testing.assert_array_equal(np.sum(w, axis=0), want.sum(axis=0))
    np.testing.assert_array_equal(w[1:, ::2], want[1:, ::2])
    np.testing.assert_array_equal(w.T, want.T)  # forwarded to the array
    assert w.tolist() == want.tolist()
    assert w.astype(np.float64).dtype == np.float64
    bits = np.asarray(state["model"]["b"]).view(np.uint16)
    np.testing.assert_array_equal(b.view(np.uint16), bits)
    assert [row.tolist() for row in w] == want.tolist()
    step = ckpt.load(path)["optimizer"]["state"][0]["step"]
    assert float(step) == 3.0 and int(step) == 3 and bool(step)
    with pytest.raises(TypeError, match="0-d"):
        len(step)
    with pytest.raises(TypeError, match="read-only"):
        np.add(w, 1, out=(w,))


def test_jax_and_torch_accept_lazy_arrays(saved) -> None:
    path, state = saved
    tree = ckpt.load(path)
    got = jnp.asarray(tree["model"]["b"])
    assert isinstance(got, jax.Array) and got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got), np.asarray(state["model"]["b"]))
    tensor = torch.tensor(np.asarray(tree["model"]["w"]))
    np.testing.assert_array_equal(tensor.numpy(), state["model"]["w"])
    assert ckpt.to_torch(tree)["model"]["b"].dtype == torch.bfloat16


def test_pickle_and_deepcopy_give_plain_values(saved) -> None:
    path, state = saved
    tree = ckpt.load(path)
    for clone in (copy.deepcopy(tree), pickle.loads(pickle.dumps(tree))):
        assert type(clone["model"]["w"]) is np.ndarray
        assert type(clone["optimizer"]["state"][0]["step"]) is np.float32
        np.testing.assert_array_equal(clone["big"], state["big"])


def test_compiled_model_and_optimizer_load_lazy_state(tmp_path: Path) -> None:
    cstorch.reset()
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    model = cstorch.compile(cstorch.FunctionalModel(lambda p, x: x @ p["w"] + p["b"], params),
                            "CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    saved_model = {"w": np.full((3, 2), 2.0, np.float32), "b": np.ones(2, np.float32)}
    ckpt.save({"model": saved_model, "optimizer": optimizer.state_dict()}, tmp_path / "c.h5")
    state = ckpt.load(tmp_path / "c.h5")
    assert isinstance(state["model"]["w"], ckpt.LazyArray)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    chex.assert_trees_all_equal(model.state_dict(), saved_model)
    cstorch.reset()


def test_file_closes_when_the_last_array_goes(saved) -> None:
    path, _ = saved
    before = _open_sources()
    tree = ckpt.load(path)
    w = tree["model"]["w"]
    del tree
    assert _open_sources() == before + 1  # w keeps the file open
    np.asarray(w)
    del w
    assert _open_sources() == before


@pytest.mark.parametrize("map_location", ["cache", "cpu", "jax"])
def test_eager_map_locations_close_the_file(tmp_path: Path, map_location: str) -> None:
    ckpt.save({"w": np.ones(3, np.float32)}, tmp_path / "c.h5")
    before = _open_sources()
    tree = ckpt.load(tmp_path / "c.h5", map_location=map_location)
    assert not isinstance(tree["w"], ckpt.LazyArray)
    assert _open_sources() == before


def test_lazy_arrays_survive_a_save_onto_the_same_path(saved) -> None:
    path, state = saved
    old = ckpt.load(path)
    ckpt.save({"model": {"w": np.zeros((3, 4), np.float32)}}, path)
    np.testing.assert_array_equal(old["model"]["w"], state["model"]["w"])  # the old file
    np.testing.assert_array_equal(ckpt.load(path)["model"]["w"], np.zeros((3, 4)))


def test_where_open_files_cannot_be_replaced_they_are_read_first(
    saved, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, state = saved
    monkeypatch.setattr(_save, "CLOSE_BEFORE_REPLACE", True)  # as on Windows
    old = ckpt.load(path)
    other = ckpt.load(path)["big"]
    before = _open_sources()
    ckpt.save({"model": {"w": np.zeros((3, 4), np.float32)}}, path)
    assert _open_sources() == before - 2  # both readers of path were released
    np.testing.assert_array_equal(old["model"]["w"], state["model"]["w"])
    np.testing.assert_array_equal(other, state["big"])
    got = np.asarray(old["big"])
    got[0] = 123.0  # what a caller gets is its own copy
    np.testing.assert_array_equal(old["big"], state["big"])


def test_damage_found_while_releasing_is_raised_on_use(
    saved, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = saved
    monkeypatch.setattr(_save, "CLOSE_BEFORE_REPLACE", True)
    old = ckpt.load(path)
    monkeypatch.setattr(_lazy.Source, "_read_locked",
                        lambda self, info: (_ for _ in ()).throw(self._damaged(info, "boom")))
    ckpt.save({"x": 1}, path)  # the save itself succeeds
    with pytest.raises(CheckpointError, match="boom"):
        np.asarray(old["big"])


def test_concurrent_reads_from_threads(saved) -> None:
    path, state = saved
    big = ckpt.load(path)["big"]
    results: list[bool] = []

    def read() -> None:
        results.append(bool(np.array_equal(np.asarray(big), state["big"])))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 4


def test_chunked_and_compressed_datasets_are_read_through_hdf5(saved) -> None:
    path, state = saved
    with h5py.File(path, "r+") as file:  # as a repacking tool might leave it
        data = file["big"][...]
        del file["big"]
        file.create_dataset("big", data=data, chunks=(4096,), compression="gzip")
    _seal.write_seal(str(path), ckpt.FORMAT_VERSION)
    np.testing.assert_array_equal(ckpt.load(path)["big"], state["big"])


def test_missing_dataset_raises_on_use(saved) -> None:
    path, _ = saved
    with h5py.File(path, "r+") as file:
        del file["model.w"]
    _seal.write_seal(str(path), ckpt.FORMAT_VERSION)
    tree = ckpt.load(path)
    with pytest.raises(CheckpointError, match=r"c\.h5.*'model\.w'.*missing"):
        np.asarray(tree["model"]["w"])
    np.asarray(tree["big"])  # the others still load


def test_a_loaded_tree_saves_again_even_onto_its_own_path(saved) -> None:
    path, state = saved
    tree = ckpt.load(path)
    tree["global_step"] = 8
    ckpt.save(tree, path)  # reads every array from the file being replaced
    again = ckpt.load(path, map_location="cache")
    assert again["global_step"] == 8
    np.testing.assert_array_equal(again["big"], state["big"])
    assert again["model"]["b"].dtype == ml_dtypes.bfloat16
    assert type(again["optimizer"]["state"][0]["step"]) is np.float32
