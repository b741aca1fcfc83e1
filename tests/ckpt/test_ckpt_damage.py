"""Truncated and corrupted checkpoints raise CheckpointError naming the file, and nothing else.

Byte flips run in a child process, so a crash inside HDF5 would fail the test instead of
taking pytest down.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import cerebrax.ckpt as ckpt
from cerebrax.ckpt import _seal
from cerebrax.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[2]


def _state() -> dict:
    rng = np.random.default_rng(1)
    return {
        "model": {"fc.weight": rng.normal(size=(300, 200)).astype(np.float32),
                  "fc.bias": rng.normal(size=200).astype(np.float16),
                  "emb": rng.integers(0, 2**16, size=(70, 9), dtype=np.uint16)},
        "optimizer": {"state": {0: {"step": np.float32(3.0), "m": np.zeros(5)}},
                      "param_groups": [{"lr": 0.1, "name": "all"}]},
        "big": rng.normal(size=(1 << 17) + 3),  # a full digest block and a tail
        "global_step": 7,
    }


def _read_all(path: Path) -> object:
    return ckpt.load(path, map_location="cache")


def _data_ranges(path: Path) -> list[tuple[int, int]]:
    with h5py.File(path, "r") as file:
        return [(d.id.get_offset(), d.id.get_offset() + d.nbytes) for d in file.values()
                if d.id.get_offset() is not None]


def _edit(path: Path, original: bytes, *, reseal: bool = True) -> h5py.File:
    """Opens a fresh copy of the checkpoint for editing; on close it is resealed, as if
    the damage had happened inside cerebrax, so the checks behind the seal are tested."""
    path.write_bytes(original)
    file = h5py.File(path, "r+")
    close = file.close

    def close_and_reseal() -> None:
        close()
        if reseal:
            _seal.write_seal(str(path), ckpt.FORMAT_VERSION)

    file.close = close_and_reseal  # type: ignore[method-assign]
    return file


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("damage") / "c.h5"
    ckpt.save(_state(), path)
    return path.read_bytes()


def test_truncated_files_raise(tmp_path: Path, original: bytes) -> None:
    path = tmp_path / "c.h5"
    size = len(original)
    cuts = sorted({0, 1, 8, 47, 48, 96, 512, 2047, 2048, 4096, size // 4, size // 2,
                   size - 4096, size - 512, size - 64, size - 1})
    for cut in cuts:
        path.write_bytes(original[:cut])
        with pytest.raises(CheckpointError) as info:
            _read_all(path)
        assert str(path) in str(info.value), cut
        assert not ckpt.is_checkpoint(path), cut


def test_lazy_read_of_a_file_truncated_after_opening(tmp_path: Path, original: bytes) -> None:
    path = tmp_path / "c.h5"
    path.write_bytes(original)
    tree = ckpt.load(path)
    with open(path, "r+b") as file:
        file.truncate(len(original) // 2)
    with pytest.raises(CheckpointError, match=r"c\.h5.*damaged"):
        for value in [tree["big"], *tree["model"].values()]:
            np.asarray(value)


def test_file_edited_by_another_program_is_refused(tmp_path: Path, original: bytes) -> None:
    path = tmp_path / "c.h5"
    with _edit(path, original, reseal=False) as file:
        file.attrs["note"] = "edited"
    with pytest.raises(CheckpointError, match=r"c\.h5.*seal .*missing"):
        ckpt.load(path)


def test_changed_data_is_caught_by_its_digest(tmp_path: Path, original: bytes) -> None:
    path = tmp_path / "c.h5"
    with _edit(path, original) as file:
        file["model.fc.weight"][17, 3] += 1.0
    tree = ckpt.load(path)
    with pytest.raises(CheckpointError, match=r"c\.h5.*'model\.fc\.weight'.*digest"):
        np.asarray(tree["model"]["fc.weight"])
    np.asarray(tree["model"]["fc.bias"])  # undamaged arrays still read


def test_changed_structure_is_caught_by_its_digest(tmp_path: Path, original: bytes) -> None:
    path = tmp_path / "c.h5"
    with _edit(path, original) as file:
        text = file.attrs["__structure__"]
        file.attrs["__structure__"] = text.replace('"lr", {"value": 0.1}', '"lr", {"value": 0.3}')
    with pytest.raises(CheckpointError, match=r"c\.h5.*does not match the digest"):
        ckpt.load(path)
    assert not ckpt.is_checkpoint(path)


@pytest.mark.parametrize(
    ("attribute", "value"),
    [("__structure__", "{not json"), ("__structure__", np.arange(3)),
     ("__SUCCESS__", np.array([1, 2])), ("__format_version__", "one")],
)
def test_bad_root_attributes_raise(tmp_path: Path, original: bytes, attribute: str,
                                   value: object) -> None:
    path = tmp_path / "c.h5"
    with _edit(path, original) as file:
        del file.attrs["__structure_digest__"]  # so only the attribute itself is bad
        file.attrs[attribute] = value
    with pytest.raises(CheckpointError, match=r"c\.h5"):
        _read_all(path)


@pytest.mark.parametrize(
    "node",
    [{"array": "big", "dtype": "object", "shape": [3], "kind": "numpy", "digest": "0"},
     {"array": "big", "dtype": "float64", "shape": [-1], "kind": "numpy", "digest": "0"},
     {"array": "big", "dtype": "float64", "shape": [7], "kind": "numpy", "digest": "0"},
     {"array": 5}, {"value": [1, 2]}, {"dict": [[1.5, {"value": 1}]]}, {"set": []}, 3],
)
def test_bad_structure_nodes_raise(tmp_path: Path, original: bytes, node: object) -> None:
    path = tmp_path / "c.h5"
    with _edit(path, original) as file:
        del file.attrs["__structure_digest__"]
        file.attrs["__structure__"] = json.dumps({"dict": [["x", node]]})
    with pytest.raises(CheckpointError, match=r"c\.h5.*damaged"):
        _read_all(path)


_FLIPPER = r"""
import json, sys
import numpy as np
import cerebrax.ckpt as ckpt
from cerebrax.errors import CheckpointError

source, work, positions = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
rng = np.random.default_rng(0)
data = bytes(open(source, "rb").read())
for position in positions:
    flipped = bytearray(data)
    flipped[position] ^= int(rng.integers(1, 256))
    with open(work, "wb") as f:
        f.write(flipped)
    try:
        ckpt.load(work, map_location="cache")
        outcome = "loaded"
    except CheckpointError as error:
        outcome = "error" if work in str(error) else f"no path: {error}"
    except BaseException as error:
        outcome = f"{type(error).__name__}: {error}"
    print(json.dumps([position, outcome]), flush=True)
"""


def test_every_flipped_byte_is_caught(tmp_path: Path, original: bytes) -> None:
    source = tmp_path / "c.h5"
    source.write_bytes(original)
    ranges = _data_ranges(source)
    end = max(stop for _, stop in ranges)
    rng = np.random.default_rng(2)
    positions = sorted(
        set(range(64))  # the superblock
        | {int(p) for p in rng.integers(64, min(start for start, _ in ranges), 300)}
        | {int(p) for p in rng.integers(end, len(original), 200)}  # attributes, seal
        | set(range(len(original) - 64, len(original)))  # the end of the seal
        | {int(rng.integers(start, stop)) for start, stop in ranges for _ in range(4)}
    )
    (tmp_path / "positions.json").write_text(json.dumps(positions))
    result = subprocess.run(
        [sys.executable, "-c", _FLIPPER, str(source), str(tmp_path / "w.h5"),
         str(tmp_path / "positions.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]  # no crash
    outcomes = dict(json.loads(line) for line in result.stdout.splitlines())
    assert len(outcomes) == len(positions)
    missed = {p: o for p, o in outcomes.items() if o != "error"}
    assert not missed, list(missed.items())[:10]
