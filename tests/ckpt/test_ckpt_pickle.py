"""Loading never unpickles: pickled payloads in H5 or torch files are refused or inert.

The payload, when unpickled, creates a marker file; no test may ever see that file.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import cerebrax.ckpt as ckpt
from cerebrax.ckpt import _seal
from cerebrax.errors import CheckpointError


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: a stand-in for running any code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (str(self.marker), "w"))


@pytest.fixture
def payload(tmp_path: Path) -> tuple[bytes, Path]:
    marker = tmp_path / "PWNED"
    data = pickle.dumps(_Payload(marker), protocol=2)
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_Payload(control), protocol=2)).close()  # such payloads are live
    assert control.exists()
    return data, marker


def _array_node(name: str, dtype: str = "uint8", shape: tuple[int, ...] = (0,)) -> dict:
    return {"array": name, "dtype": dtype, "shape": list(shape), "kind": "numpy",
            "digest": "0" * 32}


def _write(path: Path, structure: dict, fill, *, version: str = "1.1") -> None:
    """A sealed checkpoint with a hand-made structure and datasets."""
    with h5py.File(path, "w", libver=("v108", "latest")) as file:
        file.attrs["__format_version__"] = version
        file.attrs["__structure__"] = json.dumps(structure)
        fill(file)
        file.attrs["__SUCCESS__"] = True
    _seal.write_seal(str(path), version)


def _load_everything(path: Path) -> object:
    tree = ckpt.load(path)
    return [np.asarray(leaf) for leaf in tree.values() if isinstance(leaf, ckpt.LazyArray)]


def test_opaque_dataset_with_a_pickle_is_refused(tmp_path: Path, payload) -> None:
    data, marker = payload
    path = tmp_path / "c.h5"
    _write(path, {"dict": [["obj", _array_node("obj", "object", (1,))]]},
           lambda f: f.create_dataset("obj", data=np.void(data)))
    with pytest.raises(CheckpointError, match=r"c\.h5.*damaged"):
        _load_everything(path)
    assert not marker.exists()


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_pickle_bytes_under_an_array_name_are_refused(tmp_path: Path, payload,
                                                       dtype: str) -> None:
    data, marker = payload

    def fill(file: h5py.File) -> None:
        vlen = file.create_dataset("vlen", shape=(1,), dtype=h5py.vlen_dtype(np.uint8))
        vlen[0] = np.frombuffer(data, np.uint8)
        file.create_dataset("opaque", data=np.void(data))

    nodes = [["vlen", _array_node("vlen", dtype, (1,))],
             ["opaque", _array_node("opaque", dtype, (1,))]]
    _write(tmp_path / "c.h5", {"dict": nodes}, fill)
    tree = ckpt.load(tmp_path / "c.h5")
    for name in ("vlen", "opaque"):
        with pytest.raises(CheckpointError, match=rf"'{name}'.*dataset holds"):
            np.asarray(tree[name])
    assert not marker.exists()


def test_pickle_bytes_saved_as_uint8_data_stay_bytes(tmp_path: Path, payload) -> None:
    data, marker = payload
    blob = np.frombuffer(data, np.uint8)
    ckpt.save({"blob": blob}, tmp_path / "c.h5")
    loaded = np.asarray(ckpt.load(tmp_path / "c.h5")["blob"])
    assert loaded.tobytes() == data  # inert bytes, returned as such
    assert not marker.exists()


@pytest.mark.parametrize("attribute", ["__structure__", "__SUCCESS__", "__format_version__",
                                       "__structure_digest__"])
def test_pickle_in_a_root_attribute_is_refused(tmp_path: Path, payload, attribute: str) -> None:
    data, marker = payload
    path = tmp_path / "c.h5"
    ckpt.save({"w": np.ones(2)}, path)
    with h5py.File(path, "r+") as file:
        file.attrs[attribute] = np.void(data)
    _seal.write_seal(str(path), ckpt.FORMAT_VERSION)
    with pytest.raises(CheckpointError, match=r"c\.h5"):
        ckpt.load(path)
    assert not ckpt.is_checkpoint(path)
    assert not marker.exists()


def test_extra_attributes_holding_pickles_are_ignored(tmp_path: Path, payload) -> None:
    data, marker = payload
    path = tmp_path / "c.h5"
    ckpt.save({"w": np.ones(2)}, path)
    with h5py.File(path, "r+") as file:
        file.attrs["extra"] = np.void(data)
        file["w"].attrs["dtype_pickle"] = np.void(data)
    _seal.write_seal(str(path), ckpt.FORMAT_VERSION)
    np.testing.assert_array_equal(ckpt.load(path)["w"], np.ones(2))
    assert not marker.exists()


def test_legacy_cstorch_file_with_pickled_spec_is_refused(tmp_path: Path, payload) -> None:
    data, marker = payload
    path = tmp_path / "legacy.mdl"
    with h5py.File(path, "w") as file:  # release 1.7 - 2.0 layout: a hex pickle spec
        file.attrs["__spec__"] = data.hex()
        file.attrs["__version__"] = "0.4"
        file.create_dataset("model.weight", data=np.ones(2))
    with pytest.raises(CheckpointError, match=r"legacy\.mdl.*pickle.*to-h5"):
        ckpt.load(path)
    assert not marker.exists()


def test_torch_file_with_a_pickled_payload_is_refused(tmp_path: Path, payload) -> None:
    _, marker = payload
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "boom": _Payload(marker)}, path)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match=r"evil\.pt.*weights_only"):
        ckpt.convert_torch_to_h5(path, tmp_path / "out.h5")
    assert not marker.exists()
    assert not (tmp_path / "out.h5").exists()


def test_torch_file_with_a_raw_pickle_is_refused(tmp_path: Path, payload) -> None:
    data, marker = payload
    path = tmp_path / "raw.pt"
    with zipfile.ZipFile(path, "w") as archive:  # torch's zip layout, hand-made
        archive.writestr("raw/data.pkl", data)
        archive.writestr("raw/version", "3\n")
    with pytest.raises(CheckpointError, match=r"raw\.pt"):
        ckpt.convert_torch_to_h5(path, tmp_path / "out.h5")
    (tmp_path / "legacy.pt").write_bytes(data)  # a bare pickle, the pre-zip format
    with pytest.raises(CheckpointError, match=r"legacy\.pt"):
        ckpt.convert_torch_to_h5(tmp_path / "legacy.pt", tmp_path / "out.h5")
    assert not marker.exists()
