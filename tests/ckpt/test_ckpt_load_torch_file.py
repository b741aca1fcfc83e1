"""``cstorch.load`` of files written by ``torch.save``: weights only, never code.

The reference is torch itself: what ``torch.save`` wrote, ``torch.load`` of the same
file, and torch's own tensor methods on the values.
"""

from __future__ import annotations

import collections
import pickle
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
import torch

import cerebrax as cstorch
import cerebrax.ckpt as ckpt
from cerebrax.errors import CheckpointError


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: a stand-in for running any code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (str(self.marker), "w"))


def _state() -> dict:
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 4)
    return {
        "model": lin.state_dict(),  # an OrderedDict
        "half": torch.randn(2, 3).bfloat16(),
        "ints": torch.arange(5, dtype=torch.int64),
        "nested": [torch.ones(2), (torch.zeros(1), 7)],
        "step": 12,
        "name": "run",
    }


def _same(got, want, where="") -> None:
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for key in want:
            _same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}.{i}")
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), (where, type(got))
        assert got.dtype == want.dtype and torch.equal(got, want), where
    else:
        assert got == want, where


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy-pickle"])
def test_a_torch_file_loads_as_torch_loads_it(tmp_path: Path, zipped: bool) -> None:
    state = _state()
    path = tmp_path / "model.pt"
    torch.save(state, path, _use_new_zipfile_serialization=zipped)
    got = cstorch.load(path)
    _same(got, torch.load(path, weights_only=True))
    _same(got, state)
    assert isinstance(got["model"], collections.OrderedDict)


def test_torch_methods_work_on_the_loaded_values(tmp_path: Path) -> None:
    """gigaGPT transposes Conv1D weights of a Hugging Face file: ``sd[k].t()``."""
    state = _state()
    torch.save(state["model"], tmp_path / "hf.bin")
    sd = cstorch.load(tmp_path / "hf.bin")
    assert torch.equal(sd["weight"].t(), state["model"]["weight"].t())
    target = torch.nn.Linear(4, 3)
    target.weight.data.copy_(sd["weight"].t())  # the usual conversion idiom
    assert torch.equal(target.weight, state["model"]["weight"].t())


def test_return_torch_false_and_jax_give_numpy_and_jax(tmp_path: Path) -> None:
    state = _state()
    torch.save(state, tmp_path / "a.pt")
    as_numpy = cstorch.load(tmp_path / "a.pt", return_torch=False)
    assert isinstance(as_numpy["half"], np.ndarray)
    assert as_numpy["half"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(as_numpy["half"].astype(np.float32),
                                  state["half"].float().numpy())
    np.testing.assert_array_equal(as_numpy["model"]["weight"],
                                  state["model"]["weight"].numpy())
    with pytest.raises(CheckpointError, match=r"'ints'.*int64.*jax_enable_x64"):
        cstorch.load(tmp_path / "a.pt", map_location="jax")  # jax would narrow int64
    del state["ints"]
    torch.save(state, tmp_path / "a.pt")
    as_jax = cstorch.load(tmp_path / "a.pt", map_location="jax", return_torch=False)
    assert isinstance(as_jax["nested"][0], jax.Array)
    assert as_jax["half"].dtype == jax.numpy.bfloat16
    np.testing.assert_array_equal(np.asarray(as_jax["nested"][0]), np.ones(2))
    assert as_jax["step"] == 12
    with pytest.raises(CheckpointError, match="return_torch=True.*map_location='jax'"):
        cstorch.load(tmp_path / "a.pt", map_location="jax", return_torch=True)


def test_h5_checkpoints_stay_lazy_unless_torch_is_asked_for(tmp_path: Path) -> None:
    state = _state()
    cstorch.save(state, tmp_path / "c.mdl")
    lazy = cstorch.load(tmp_path / "c.mdl")
    assert isinstance(lazy["half"], ckpt.LazyArray)
    tensors = cstorch.load(tmp_path / "c.mdl", return_torch=True)
    _same(tensors["model"], state["model"])
    _same(tensors["half"], state["half"])
    assert torch.equal(tensors["model"]["weight"].t(), state["model"]["weight"].t())


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy-pickle"])
def test_code_in_a_torch_file_never_runs(tmp_path: Path, zipped: bool) -> None:
    marker = tmp_path / "PWNED"
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_Payload(control))).close()
    assert control.exists()  # such a payload is live when fully unpickled
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "boom": _Payload(marker)}, path,
               _use_new_zipfile_serialization=zipped)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match=r"evil\.pt.*weights_only=True") as info:
        cstorch.load(path)
    assert "weights_only=False" in str(info.value)  # names the way out for trusted files
    assert not marker.exists()


def test_a_bare_pickle_is_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "raw.pt"
    path.write_bytes(pickle.dumps(_Payload(marker), protocol=4))
    with pytest.raises(CheckpointError, match=r"raw\.pt"):
        cstorch.load(path)
    assert not marker.exists()


def test_other_files_are_still_refused_as_not_checkpoints(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match=r"notes\.txt.*not a cerebrax H5"):
        cstorch.load(tmp_path / "notes.txt")
