"""torch ``.pt`` <-> H5 conversion: the Python API and ``python -m cerebrax.ckpt``."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import cerebrax.ckpt as ckpt
from cerebrax.ckpt.__main__ import main
from cerebrax.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[2]

_TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                 torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16,
                 torch.float32, torch.float64, torch.complex64, torch.complex128]


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Arbitrary bits (NaN payloads, -0.0, subnormals) of ``dtype``."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.5
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = int(np.prod(shape, dtype=np.int64)) * itemsize
    raw = np.random.default_rng(seed).integers(0, 256, count, dtype=np.uint8)
    return torch.from_numpy(raw).view(dtype).reshape(shape).clone()


def _state() -> dict:
    linear = torch.nn.Linear(3, 2).to(torch.bfloat16)
    return {
        "model": linear.state_dict(),  # an OrderedDict with torch's _metadata
        "tensors": {str(d).removeprefix("torch."): _tensor(d, (2, 3), i)
                    for i, d in enumerate(_TORCH_DTYPES)},
        "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2, 3)}},
                      "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0],
                                        "foreach": None, "name": "all"}]},
        "shapes": [torch.zeros(0, 4), torch.tensor(5, dtype=torch.int64)],
        "global_step": 12,
    }


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).contiguous().view(torch.uint8)


def _assert_same(got: Any, want: Any, where: str = "root") -> None:
    if isinstance(want, dict):
        assert type(got) is dict, where  # OrderedDict comes back as dict
        assert list(got) == list(want), where
        for key in want:
            _assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_same(g, w, f"{where}.{i}")
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), (where, type(got))
        assert (got.dtype, got.shape) == (want.dtype, want.shape), where
        assert torch.equal(_bits(got), _bits(want)), where
    else:
        assert type(got) is type(want) and got == want, where


def test_torch_to_h5_to_torch_round_trip(tmp_path: Path) -> None:
    state = _state()
    torch.save(state, tmp_path / "a.pt")
    ckpt.convert_torch_to_h5(tmp_path / "a.pt", tmp_path / "a.h5")
    assert ckpt.is_checkpoint(tmp_path / "a.h5")
    loaded = ckpt.load(tmp_path / "a.h5")
    assert loaded["tensors"]["bfloat16"].dtype == ml_dtypes.bfloat16
    assert loaded["optimizer"]["state"][0]["step"].shape == ()
    ckpt.convert_h5_to_torch(tmp_path / "a.h5", tmp_path / "b.pt")
    _assert_same(torch.load(tmp_path / "b.pt", weights_only=True), state)


def test_h5_of_numpy_and_jax_arrays_becomes_tensors(tmp_path: Path) -> None:
    state = {"w": jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3),
             "n": np.arange(3, dtype=np.int16), "s": np.float32(2.5), "meta": [None, "x"]}
    ckpt.save(state, tmp_path / "a.h5")
    ckpt.convert_h5_to_torch(tmp_path / "a.h5", tmp_path / "a.pt")
    got = torch.load(tmp_path / "a.pt", weights_only=True)
    assert got["w"].dtype == torch.bfloat16
    np.testing.assert_array_equal(got["w"].float().numpy(), np.arange(6).reshape(2, 3))
    assert got["n"].dtype == torch.int16 and got["s"].shape == () and float(got["s"]) == 2.5
    assert got["meta"] == [None, "x"]


def test_converted_file_loads_into_a_torch_module(tmp_path: Path) -> None:
    source = torch.nn.Linear(4, 3)
    ckpt.save({"model": source.state_dict()}, tmp_path / "a.h5")
    ckpt.convert_h5_to_torch(tmp_path / "a.h5", tmp_path / "a.pt")
    target = torch.nn.Linear(4, 3)
    target.load_state_dict(torch.load(tmp_path / "a.pt", weights_only=True)["model"])
    assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)


def test_lazy_arrays_load_into_a_plain_torch_module(tmp_path: Path) -> None:
    """cstorch.load's arrays are tensor-like: a torch module that cerebrax never compiled
    takes them in load_state_dict, and torch functions read them as tensors."""
    torch.manual_seed(0)
    saved = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    saved.train()(torch.randn(8, 4))  # moves the running statistics off their defaults
    ckpt.save({"model": saved.state_dict(), "half": torch.arange(4.0).bfloat16()},
              tmp_path / "c.mdl")
    state = ckpt.load(tmp_path / "c.mdl")
    assert isinstance(state["model"]["0.weight"], ckpt.LazyArray)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    fresh.load_state_dict(state["model"])
    for name, value in saved.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name
    assert torch.equal(state["half"], torch.arange(4.0).bfloat16())
    assert torch.add(state["half"], 1).dtype == torch.bfloat16


def test_unsupported_torch_value_is_refused_by_key(tmp_path: Path) -> None:
    torch.save({"cfg": {"dtype": torch.float32}}, tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match=r"'cfg\.dtype'.*torch\.dtype"):
        ckpt.convert_torch_to_h5(tmp_path / "a.pt", tmp_path / "a.h5")
    assert not (tmp_path / "a.h5").exists()


def test_missing_and_bad_sources_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no\.pt.*no such file"):
        ckpt.convert_torch_to_h5(tmp_path / "no.pt", tmp_path / "a.h5")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(CheckpointError, match=r"text\.pt"):
        ckpt.convert_torch_to_h5(tmp_path / "text.pt", tmp_path / "a.h5")
    with pytest.raises(CheckpointError, match=r"no\.h5"):
        ckpt.convert_h5_to_torch(tmp_path / "no.h5", tmp_path / "a.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.pt"]


def test_command_line_in_process(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    torch.save({"w": torch.ones(2, dtype=torch.float16)}, tmp_path / "a.pt")
    assert main(["to-h5", str(tmp_path / "a.pt"), str(tmp_path / "a.h5")]) == 0
    assert main(["to-torch", str(tmp_path / "a.h5"), str(tmp_path / "b.pt")]) == 0
    assert torch.load(tmp_path / "b.pt", weights_only=True)["w"].dtype == torch.float16
    assert main(["to-torch", str(tmp_path / "missing.h5"), str(tmp_path / "c.pt")]) == 1
    assert "missing.h5" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["to-onnx", "a", "b"])
    assert info.value.code == 2


def test_command_line_as_a_module(tmp_path: Path) -> None:
    torch.save(collections.OrderedDict(w=torch.arange(4.0)), tmp_path / "a.pt")
    for command, src, dst in (("to-h5", "a.pt", "a.h5"), ("to-torch", "a.h5", "b.pt")):
        subprocess.run([sys.executable, "-m", "cerebrax.ckpt", command, str(tmp_path / src),
                        str(tmp_path / dst)], cwd=ROOT, check=True, capture_output=True)
    assert torch.equal(torch.load(tmp_path / "b.pt", weights_only=True)["w"], torch.arange(4.0))
