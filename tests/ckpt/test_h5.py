"""Tests of the cerebrax H5 checkpoint format (cerebrax.ckpt)."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import cerebrax.ckpt as ckpt
from cerebrax.ckpt import _save
from cerebrax.errors import CheckpointError

_DTYPES = [
    np.dtype(name)
    for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
        "uint64", "float16", "float32", "float64", "complex64", "complex128",
    )
] + [np.dtype(ml_dtypes.bfloat16)]  # fmt: skip
_KINDS = ["numpy", "numpy_scalar", "jax", "torch"]
_SHAPES = {"zero_d": (), "empty": (0, 3), "matrix": (3, 5)}


# ------------------------------------------------------------------- references


def _random_bits(dtype: np.dtype, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Arbitrary bit patterns: NaN payloads, infinities, -0.0 and subnormals."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    size = int(np.prod(shape)) * dtype.itemsize
    return np.frombuffer(rng.bytes(size), dtype=dtype).reshape(shape).copy()


def _to_torch(array: np.ndarray) -> torch.Tensor:
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _make_leaf(array: np.ndarray, kind: str) -> Any:
    if kind == "numpy":
        return array
    if kind == "numpy_scalar":
        return array[()]
    if kind == "jax":
        return jnp.asarray(array)
    return _to_torch(array)


def _reference(leaf: Any) -> np.ndarray:
    """The numpy array a leaf should load as (bits reinterpreted, never cast)."""
    if isinstance(leaf, torch.Tensor):
        leaf = leaf.detach()
        if leaf.dtype == torch.bfloat16:
            return leaf.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return leaf.numpy()
    return np.asarray(leaf)


def _assert_same_bits(got: Any, want: Any, where: str) -> None:
    if isinstance(got, ckpt.LazyArray):  # what load gives without map_location
        assert got.shape == np.shape(want) and got.dtype == _reference(want).dtype, where
        got = got.numpy()
    expected = _reference(want)
    if isinstance(want, np.generic):
        assert type(got) is type(want), where
    else:
        assert type(got) is np.ndarray, (where, type(got))
    actual = np.asarray(got)
    assert actual.dtype == expected.dtype, (where, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (where, actual.shape, expected.shape)
    assert actual.tobytes() == expected.tobytes(), where


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic, jax.Array, torch.Tensor))


def _assert_same_tree(got: Any, want: Any, where: str = "root") -> None:
    """Same containers (exact types), keys with key types, order, and leaf bits."""
    if isinstance(want, dict):
        assert type(got) is dict, (where, type(got))
        assert [(type(k), k) for k in got] == [(type(k), k) for k in want], where
        for key in want:
            _assert_same_tree(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is (list if isinstance(want, list) else tuple), where
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_same_tree(g, w, f"{where}[{i}]")
    elif _is_array(want):
        _assert_same_bits(got, want, where)
    else:
        assert type(got) is type(want), (where, type(got), type(want))
        assert repr(got) == repr(want), where  # repr tells nan, -0.0 and inf apart


def _optimizer_like_state() -> dict:
    weight = torch.nn.Parameter(torch.randn(4, 3))
    return {
        "model": collections.OrderedDict(
            [("fc.weight", weight), ("fc.bias", jnp.arange(3, dtype=jnp.bfloat16))]
        ),
        "optimizer": {
            "state": {
                0: {"step": torch.tensor(7.0), "exp_avg": np.ones((4, 3), np.float16)},
                1: {"step": np.int64(7), "exp_avg": jnp.zeros(3)},
            },
            "param_groups": [
                {
                    "lr": 1e-3,
                    "betas": (0.9, 0.999),
                    "params": [0, 1],
                    "amsgrad": False,
                    "foreach": None,
                    "lr_tensor": np.array(0.5, np.float32),
                },
            ],
        },
        "schedulers": [{"last_epoch": 10, "_step_count": 2**40, "name": "cosine"}],
        "odd_floats": [float("nan"), -0.0, float("inf"), 1e-310],
        "global_step": 123,
        "empty": {"dict": {}, "list": [], "tuple": ()},
    }


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -------------------------------------------------------------------- round trip


@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_round_trip_is_bitwise(tmp_path: Path, dtype: np.dtype, kind: str) -> None:
    if kind == "jax" and jax.dtypes.canonicalize_dtype(dtype) != dtype:
        pytest.skip(f"jax arrays cannot hold {dtype} without jax_enable_x64")
    if kind == "numpy_scalar":
        shapes = {"zero_d": ()}
    else:
        shapes = _SHAPES
    state = {
        label: _make_leaf(_random_bits(dtype, shape, seed), kind)
        for seed, (label, shape) in enumerate(shapes.items())
    }
    ckpt.save(state, tmp_path / "c.h5")
    _assert_same_tree(ckpt.load(tmp_path / "c.h5"), state)


def test_round_trip_optimizer_like_state(tmp_path: Path) -> None:
    state = _optimizer_like_state()
    ckpt.save(state, tmp_path / "c.h5")
    _assert_same_tree(ckpt.load(str(tmp_path / "c.h5")), state)


def test_torch_views_and_grad_tensors_round_trip(tmp_path: Path) -> None:
    base = torch.randn(6, 4).to(torch.bfloat16)
    state = {
        "strided": base[:, 1],
        "transposed": base.t(),
        "grad": torch.randn(3, requires_grad=True) * 2,
        "conj": torch.randn(3, dtype=torch.complex64).conj(),
    }
    ckpt.save(state, tmp_path / "c.h5")
    loaded = ckpt.load(tmp_path / "c.h5")
    state["conj"] = state["conj"].resolve_conj()
    _assert_same_tree(loaded, state)


def _join_retiring_threads() -> None:
    import threading

    for thread in threading.enumerate():
        if thread.name == "cerebrax-retire":
            thread.join(10)


@pytest.mark.parametrize("hard_links", [True, False])
def test_overwrite_replaces_previous_checkpoint(tmp_path: Path, monkeypatch,
                                                hard_links: bool) -> None:
    if not hard_links:  # a file system without hard links: the rename frees the old file
        def no_link(*args: Any, **kwargs: Any) -> None:
            raise OSError("hard links not supported")
        monkeypatch.setattr(os, "link", no_link)
    ckpt.save({"w": np.zeros(2)}, tmp_path / "c.h5")
    old = ckpt.load(tmp_path / "c.h5")  # lazy: keeps reading the replaced file
    ckpt.save({"w": np.ones(3)}, tmp_path / "c.h5")
    _assert_same_tree(ckpt.load(tmp_path / "c.h5"), {"w": np.ones(3)})
    _join_retiring_threads()
    assert os.listdir(tmp_path) == ["c.h5"]  # the old file's second link is gone too
    np.testing.assert_array_equal(np.asarray(old["w"]), np.zeros(2))


def test_large_structure_fits(tmp_path: Path) -> None:
    state = {f"layer_{i}": {"name": "x" * 100, "n": i} for i in range(2000)}
    ckpt.save(state, tmp_path / "c.h5")
    _assert_same_tree(ckpt.load(tmp_path / "c.h5"), state)


# ------------------------------------------------------------------ map_location


def test_map_location_jax_gives_equal_jax_arrays(tmp_path: Path) -> None:
    state = {
        "bf16": jnp.asarray(_random_bits(np.dtype(ml_dtypes.bfloat16), (4, 2), 0)),
        "f16": torch.randn(3).half(),
        "i8": np.arange(5, dtype=np.int8),
        "b": np.array([True, False]),
        "zero_d": np.array(2.5, np.float32),
        "scalar": np.float32(1.25),
        "meta": {"lr": 0.1},
    }
    ckpt.save(state, tmp_path / "c.h5")
    loaded = ckpt.load(tmp_path / "c.h5", map_location="jax")
    for key in ("bf16", "f16", "i8", "b", "zero_d", "scalar"):
        assert isinstance(loaded[key], jax.Array), key
        _assert_same_bits(np.asarray(loaded[key]), _reference(state[key]), key)
    assert loaded["meta"] == {"lr": 0.1}


def test_map_location_jax_refuses_narrowing_64_bit(tmp_path: Path) -> None:
    assert not jax.config.jax_enable_x64
    ckpt.save({"step": np.array([2**40])}, tmp_path / "c.h5")
    with pytest.raises(CheckpointError, match=r"'step'.*int64.*jax_enable_x64"):
        ckpt.load(tmp_path / "c.h5", map_location="jax")


@pytest.mark.parametrize("map_location", ["cache", "cpu"])
def test_map_location_cache_gives_numpy(tmp_path: Path, map_location: Any) -> None:
    state = {"w": jnp.ones(2), "s": np.float32(2.5), "b": torch.ones(2, dtype=torch.bfloat16)}
    ckpt.save(state, tmp_path / "c.h5")
    loaded = ckpt.load(tmp_path / "c.h5", map_location=map_location)
    assert type(loaded["w"]) is np.ndarray and type(loaded["b"]) is np.ndarray
    _assert_same_tree(loaded, state)


def test_no_map_location_gives_lazy_arrays(tmp_path: Path) -> None:
    ckpt.save({"w": jnp.ones(2)}, tmp_path / "c.h5")
    loaded = ckpt.load(tmp_path / "c.h5")
    assert type(loaded["w"]) is ckpt.LazyArray


@pytest.mark.parametrize("map_location", ["cuda", "gpu", 0])
def test_unknown_map_location_refused(tmp_path: Path, map_location: Any) -> None:
    ckpt.save({"w": np.ones(2)}, tmp_path / "c.h5")
    with pytest.raises(CheckpointError, match=r"map_location.*'cache'.*'jax'"):
        ckpt.load(tmp_path / "c.h5", map_location=map_location)


# ------------------------------------------------------------------------ layout


def test_on_disk_layout(tmp_path: Path) -> None:
    state = {
        "model": {"fc.weight": torch.ones(2, dtype=torch.bfloat16)},
        "optimizer": {"state": {0: {"exp_avg": np.zeros(2)}}, "lr": 0.1},
    }
    ckpt.save(state, tmp_path / "c.h5")
    with h5py.File(tmp_path / "c.h5", "r") as file:
        assert sorted(file) == ["model.fc.weight", "optimizer.state.0.exp_avg"]
        weight = file["model.fc.weight"]
        assert weight.dtype == np.uint16
        assert weight.attrs["dtype"] == "bfloat16"
        assert weight.attrs["kind"] == "torch"
        assert file["optimizer.state.0.exp_avg"].attrs["kind"] == "numpy"
        assert file.attrs["__format_version__"] == ckpt.FORMAT_VERSION == "1.1"
        assert isinstance(file.attrs["__cerebrax_version__"], str)
        assert bool(file.attrs["__SUCCESS__"])
        structure = json.loads(file.attrs["__structure__"])
    assert structure["dict"][1][1]["dict"][0][1]["dict"][0][0] == 0  # int key
    assert structure["dict"][1][1]["dict"][1] == ["lr", {"value": 0.1}]


def test_torch_is_not_imported_by_save_and_load(tmp_path: Path) -> None:
    code = (
        "import sys, numpy as np, cerebrax.ckpt as c\n"
        f"c.save({{'w': np.ones(2), 'n': 1}}, {str(tmp_path / 'c.h5')!r})\n"
        f"c.load({str(tmp_path / 'c.h5')!r})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=root, check=True)


# ------------------------------------------------------------------ bad files


def _write_hand_made(path: Path, *, success: bool, version: str = "1.0") -> None:
    with h5py.File(path, "w") as file:
        file.attrs["__format_version__"] = version
        file.attrs["__structure__"] = json.dumps({"dict": [["w", {"array": "w"}]]})
        file.create_dataset("w", data=np.ones(2))
        file["w"].attrs["dtype"] = "float64"
        if success:
            file.attrs["__SUCCESS__"] = True


def test_hand_made_complete_file_loads(tmp_path: Path) -> None:
    _write_hand_made(tmp_path / "c.h5", success=True)
    _assert_same_tree(ckpt.load(tmp_path / "c.h5"), {"w": np.ones(2)})


def test_partially_written_file_refused(tmp_path: Path) -> None:
    _write_hand_made(tmp_path / "c.h5", success=False)
    with pytest.raises(CheckpointError) as info:
        ckpt.load(tmp_path / "c.h5")
    message = str(info.value)
    assert message.startswith("Cannot load partially written checkpoint at ")
    assert str(tmp_path / "c.h5") in message


def test_text_file_refused(tmp_path: Path) -> None:
    (tmp_path / "c.h5").write_text("not a checkpoint\n")
    with pytest.raises(CheckpointError, match="is not a cerebrax H5 checkpoint"):
        ckpt.load(tmp_path / "c.h5")


def test_foreign_hdf5_file_refused(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "c.h5", "w") as file:
        file.create_dataset("weights", data=np.ones(3))
    with pytest.raises(CheckpointError, match="is not a cerebrax H5 checkpoint"):
        ckpt.load(tmp_path / "c.h5")


def test_newer_format_version_refused(tmp_path: Path) -> None:
    ckpt.save({"w": np.ones(2)}, tmp_path / "c.h5")
    with h5py.File(tmp_path / "c.h5", "r+") as file:
        file.attrs["__format_version__"] = "2.0"
    with pytest.raises(CheckpointError, match=r"format version 2\.0.*version 1\.1"):
        ckpt.load(tmp_path / "c.h5")


def test_missing_file_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="missing.h5") as info:
        ckpt.load(tmp_path / "missing.h5")
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_is_checkpoint(tmp_path: Path) -> None:
    ckpt.save({"w": np.ones(2)}, tmp_path / "good.h5")
    _write_hand_made(tmp_path / "partial.h5", success=False)
    _write_hand_made(tmp_path / "newer.h5", success=True, version="1.2")
    (tmp_path / "text.h5").write_text("hello")
    with h5py.File(tmp_path / "foreign.h5", "w"):
        pass
    assert ckpt.is_checkpoint(tmp_path / "good.h5")
    for name in ("partial.h5", "newer.h5", "text.h5", "foreign.h5", "none.h5"):
        assert not ckpt.is_checkpoint(tmp_path / name), name


# ----------------------------------------------------------------- atomic write


def _fail_after_first_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    original = _save._write_leaf
    written: list[str] = []

    def flaky(file: h5py.File, fd: int, leaf: Any, array: Any) -> Any:
        if written:
            raise RuntimeError("simulated crash mid-save")
        written.append(leaf.name)
        return original(file, fd, leaf, array)

    monkeypatch.setattr(_save, "_write_leaf", flaky)


def test_failed_save_keeps_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.h5"
    previous = {"a": np.arange(3), "b": np.ones(2, np.float16), "step": 1}
    ckpt.save(previous, path)
    before = _digest(path)
    _fail_after_first_dataset(monkeypatch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        ckpt.save({"a": np.zeros(3), "b": np.zeros(2), "step": 2}, path)
    assert _digest(path) == before
    _assert_same_tree(ckpt.load(path), previous)
    assert os.listdir(tmp_path) == ["c.h5"]


def test_failed_first_save_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fail_after_first_dataset(monkeypatch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        ckpt.save({"a": np.zeros(3), "b": np.zeros(2)}, tmp_path / "c.h5")
    assert os.listdir(tmp_path) == []


def test_traced_value_refused_and_cleaned_up(tmp_path: Path) -> None:
    def step(x: jax.Array) -> jax.Array:
        ckpt.save({"params": {"w": x}}, tmp_path / "c.h5")
        return x

    with pytest.raises(CheckpointError, match=r"'params\.w'.*traced"):
        jax.jit(step)(jnp.ones(2))
    assert os.listdir(tmp_path) == []


def test_missing_parent_directory_refused(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "dir" / "c.h5"
    with pytest.raises(CheckpointError, match=r"directory .*no/such/dir.* not exist"):
        ckpt.save({"w": np.ones(2)}, target)
    assert not (tmp_path / "no").exists()


# ------------------------------------------------------------------ bad trees


@pytest.mark.parametrize(
    ("leaf", "type_name"),
    [(object(), "builtins.object"), ({1, 2}, "builtins.set"), (b"xy", "bytes")],
)
def test_unsupported_leaf_refused(tmp_path: Path, leaf: Any, type_name: str) -> None:
    state = {"model": {"w": np.ones(2), "extra": [0, leaf]}}
    with pytest.raises(CheckpointError, match=rf"'model\.extra\.1'.*{type_name}"):
        ckpt.save(state, tmp_path / "c.h5")
    assert os.listdir(tmp_path) == []


_UNSUPPORTED_ARRAYS = [
    np.array(["a", "b"]),
    np.array([None], dtype=object),
    np.zeros(2, "<M8[s]"),
    np.zeros(2, ml_dtypes.float8_e4m3fn),
]


@pytest.mark.parametrize("array", _UNSUPPORTED_ARRAYS, ids=lambda a: a.dtype.name)
def test_unsupported_dtype_refused(tmp_path: Path, array: np.ndarray) -> None:
    dtype = re.escape(array.dtype.name)
    with pytest.raises(CheckpointError, match=rf"'opt\.m'.*dtype {dtype} is not"):
        ckpt.save({"opt": {"m": array}}, tmp_path / "c.h5")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("key", [(1, 2), 1.5, True, None, np.int64(3)])
def test_non_str_int_dict_key_refused(tmp_path: Path, key: Any) -> None:
    with pytest.raises(CheckpointError, match=r"'optimizer\.state'.*str or int"):
        ckpt.save({"optimizer": {"state": {key: np.ones(1)}}}, tmp_path / "c.h5")
    assert os.listdir(tmp_path) == []


def test_keys_with_dots_and_separators_round_trip(tmp_path: Path) -> None:
    state = {
        "model": {"fc.weight": np.ones(2), "a/b": np.zeros(1), "%2F": np.ones(1)},
        "": {"": np.arange(2), ".": np.arange(3)},
    }
    ckpt.save(state, tmp_path / "c.h5")
    _assert_same_tree(ckpt.load(tmp_path / "c.h5"), state)
    with h5py.File(tmp_path / "c.h5", "r") as file:
        assert "model.fc.weight" in file
        assert "model.a%2Fb" in file


@pytest.mark.parametrize(
    "state",
    [
        {"a.b": np.ones(1), "a": {"b": np.ones(1)}},
        {"s": {0: np.ones(1), "0": np.ones(1)}},
    ],
    ids=["dotted", "int_vs_str"],
)
def test_colliding_dataset_names_refused(tmp_path: Path, state: dict) -> None:
    with pytest.raises(CheckpointError, match=r"both map to the dataset name"):
        ckpt.save(state, tmp_path / "c.h5")
    assert os.listdir(tmp_path) == []


def test_self_referencing_tree_refused(tmp_path: Path) -> None:
    state: dict = {"a": []}
    state["a"].append(state)
    with pytest.raises(CheckpointError, match=r"'a\.0' contains itself"):
        ckpt.save(state, tmp_path / "c.h5")


def test_non_container_root_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="expects a state dict"):
        ckpt.save(np.ones(2), tmp_path / "c.h5")  # type: ignore[arg-type]
