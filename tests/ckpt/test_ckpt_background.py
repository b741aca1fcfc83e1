"""Background saves: host copies at the call, one pending write, errors never lost.

``save(..., background=True)`` must write the same file as a synchronous save, hold
the values the arrays had at the call, wait for the previous background save, and
raise a failed write's error once: at ``wait()``, at the next save or at exit.
Killing the process mid-write is covered in test_ckpt_kill.py.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import cerebrax.ckpt as ckpt
from cerebrax.ckpt import _save, _stage
from cerebrax.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_pending_save():
    """Every test leaves no background save behind and starts with no kept buffers."""
    _stage.BUFFERS.clear()
    yield
    try:
        ckpt.wait()
    finally:
        _stage.BUFFERS.clear()


def _tree(saved_path: Path) -> dict:
    ckpt.save({"w": np.arange(6.0).reshape(2, 3)}, saved_path)
    return {
        "jax": {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4),
                "bf16": jnp.ones(5, jnp.bfloat16)},
        "numpy": [np.arange(7, dtype=np.int64), np.float32(2.5), np.zeros((0, 3))],
        "torch": (torch.arange(4, dtype=torch.float32), torch.ones(3, dtype=torch.bfloat16)),
        "lazy": ckpt.load(saved_path)["w"],
        "step": 7,
        "name": "run",
    }


def test_background_save_equals_a_synchronous_save_bit_for_bit(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "lazy.h5")
    ckpt.save(tree, tmp_path / "sync.h5")
    handle = ckpt.save(tree, tmp_path / "background.h5", background=True)
    assert isinstance(handle, ckpt.SaveHandle)
    assert handle.wait() is None and handle.done()
    assert (tmp_path / "sync.h5").read_bytes() == (tmp_path / "background.h5").read_bytes()


def test_default_save_is_synchronous_and_returns_none(tmp_path: Path) -> None:
    assert ckpt.save({"w": np.ones(2)}, tmp_path / "c.h5") is None


def test_saved_values_are_those_at_the_call(tmp_path: Path) -> None:
    numpy_array = np.arange(1000, dtype=np.float32)
    torch_tensor = torch.arange(1000, dtype=torch.float32)
    bf16 = torch.ones(10, dtype=torch.bfloat16)
    params = jnp.arange(1000, dtype=jnp.float32)
    step = jax.jit(lambda p: p * 0 - 1, donate_argnums=0)

    handle = ckpt.save({"np": numpy_array, "torch": torch_tensor, "bf16": bf16,
                        "jax": params}, tmp_path / "c.h5", background=True)
    numpy_array[:] = -1  # changed in place right after the call
    torch_tensor.add_(5)
    bf16.mul_(3)
    params = step(params)  # the saved jax buffer is donated
    handle.wait()

    loaded = ckpt.load(tmp_path / "c.h5", map_location="cache")
    np.testing.assert_array_equal(loaded["np"], np.arange(1000, dtype=np.float32))
    np.testing.assert_array_equal(loaded["torch"], np.arange(1000, dtype=np.float32))
    np.testing.assert_array_equal(loaded["bf16"], np.ones(10, ml_dtypes.bfloat16))
    np.testing.assert_array_equal(loaded["jax"], np.arange(1000, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(params), -np.ones(1000, np.float32))


def test_host_buffers_are_reused_by_the_next_background_save(tmp_path: Path) -> None:
    first = np.arange(100.0)
    ckpt.save({"w": first}, tmp_path / "a.h5", background=True).wait()
    (kept,) = _stage.BUFFERS._free[((100,), first.dtype.str)]
    ckpt.save({"w": first + 1}, tmp_path / "b.h5", background=True).wait()
    np.testing.assert_array_equal(kept, first + 1)  # the same buffer, rewritten
    np.testing.assert_array_equal(ckpt.load(tmp_path / "a.h5")["w"], first)


def _blocking_writes(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list]:
    """Makes the first write block until the returned event is set; logs writes."""
    release, log = threading.Event(), []
    original = _save._write_file

    def write(temp: str, *args: Any) -> None:
        log.append(("start", os.path.basename(temp)))
        if len(log) == 1:
            assert release.wait(timeout=60)
        original(temp, *args)
        log.append(("end", os.path.basename(temp)))

    monkeypatch.setattr(_save, "_write_file", write)
    return release, log


def test_a_second_save_waits_for_the_first(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    release, log = _blocking_writes(monkeypatch)
    first = ckpt.save({"n": 1, "w": np.ones(3)}, tmp_path / "a.h5", background=True)
    second_done = threading.Event()

    def second() -> None:
        ckpt.save({"n": 2}, tmp_path / "b.h5", background=True).wait()
        second_done.set()

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.3)
    assert not first.done() and not second_done.is_set()
    assert [kind for kind, _ in log] == ["start"]  # the second has not begun writing
    release.set()
    thread.join(timeout=60)
    assert [kind for kind, _ in log] == ["start", "end", "start", "end"]
    assert ckpt.load(tmp_path / "a.h5")["n"] == 1 and ckpt.load(tmp_path / "b.h5")["n"] == 2


def test_load_of_the_path_being_written_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.h5"
    ckpt.save({"n": 1}, path)
    release, _ = _blocking_writes(monkeypatch)
    ckpt.save({"n": 2}, path, background=True)
    threading.Timer(0.2, release.set).start()
    assert ckpt.load(path)["n"] == 2


def _failing_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every leaf write fails from now on; the event is set once one has failed."""
    failed = threading.Event()

    def fail(*args: Any) -> None:
        failed.set()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_save, "_write_leaf", fail)
    return failed


def test_write_error_is_raised_by_wait_and_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.h5"
    ckpt.save({"n": 1, "w": np.ones(2)}, path)
    _failing_writes(monkeypatch)
    handle = ckpt.save({"n": 2, "w": np.zeros(2)}, path, background=True)
    for _ in range(2):  # the handle raises on every call
        with pytest.raises(CheckpointError, match=r"background save .*c\.h5.*No space left"):
            handle.wait()
    ckpt.wait()  # raised already: not again
    assert ckpt.load(path)["n"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["c.h5"]  # no temporary file left


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device"),
    RuntimeError("Can't write data (file write failed: errno = 28)"),  # as HDF5 says it
], ids=["OSError", "h5py-RuntimeError"])
def test_a_failed_synchronous_write_is_a_checkpoint_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    path = tmp_path / "c.h5"
    ckpt.save({"n": 1, "w": np.ones(2)}, path)

    def fail(*args: Any) -> None:
        raise error

    monkeypatch.setattr(_save, "_write_leaf", fail)
    with pytest.raises(CheckpointError, match=rf"Could not write checkpoint .*c\.h5.*"
                                              rf"{re.escape(str(error))}"):
        ckpt.save({"n": 2, "w": np.zeros(2)}, path)
    monkeypatch.undo()
    assert ckpt.load(path)["n"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["c.h5"]  # no temporary file left


def test_write_error_is_raised_by_the_next_save_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = _failing_writes(monkeypatch)
    ckpt.save({"w": np.ones(2)}, tmp_path / "a.h5", background=True)
    assert failed.wait(timeout=60)  # the writer thread has met the failing write
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match=r"background save .*a\.h5.*failed"):
        ckpt.save({"n": 2}, tmp_path / "b.h5")
    assert not (tmp_path / "b.h5").exists()  # the failing call saved nothing
    ckpt.save({"n": 2}, tmp_path / "b.h5", background=True)
    ckpt.wait()
    assert ckpt.load(tmp_path / "b.h5")["n"] == 2


def test_write_error_is_raised_by_module_wait(tmp_path: Path) -> None:
    directory = tmp_path / "gone"
    directory.mkdir()
    release = threading.Event()
    original = _save._existing_directory

    def directory_removed_meanwhile(target: str) -> str:
        if threading.current_thread().name == "cerebrax-save":
            assert release.wait(timeout=60)
        return original(target)

    _save._existing_directory = directory_removed_meanwhile
    try:
        ckpt.save({"n": 1}, directory / "c.h5", background=True)
        directory.rmdir()
        release.set()
        with pytest.raises(CheckpointError, match=r"failed: .*gone.* does not exist"):
            ckpt.wait()
    finally:
        _save._existing_directory = original
    ckpt.wait()  # nothing pending any more


def test_missing_directory_is_refused_at_the_call(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"directory .*missing.* does not exist"):
        ckpt.save({"n": 1}, tmp_path / "missing" / "c.h5", background=True)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_exit_waits_for_the_pending_save(tmp_path: Path) -> None:
    path = tmp_path / "c.h5"
    result = _run(
        "import numpy as np, cerebrax.ckpt as ckpt\n"
        f"ckpt.save({{'w': np.arange(1 << 22, dtype=np.float32)}}, {str(path)!r}, "
        "background=True)\n"
    )
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(ckpt.load(path)["w"], np.arange(1 << 22, dtype=np.float32))


def test_exit_reports_an_unraised_write_error(tmp_path: Path) -> None:
    result = _run(
        "import numpy as np, cerebrax.ckpt as ckpt\n"
        "from cerebrax.ckpt import _save\n"
        "def fail(*args): raise OSError(28, 'No space left on device')\n"
        "_save._write_leaf = fail\n"
        f"ckpt.save({{'w': np.ones(3)}}, {str(tmp_path / 'c.h5')!r}, background=True)\n"
    )
    assert "CheckpointError: The background save of checkpoint" in result.stderr
    assert "No space left on device" in result.stderr
    assert not (tmp_path / "c.h5").exists()
