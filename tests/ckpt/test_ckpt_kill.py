"""A save killed with SIGKILL never costs the previous checkpoint at the same path.

A child process saves a 128 MiB checkpoint over a small one, synchronously or in the
background, and is killed, either from inside (at a chosen step of the save; in the
background, from the writer thread while the main thread goes on) or from outside (a
few milliseconds after the save began). Afterwards the path holds the previous
checkpoint, byte for byte, or (when the kill came after the rename) the complete new
one; leftover temporary files are never taken for checkpoints and
``clean_temporary_files`` removes them.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import cerebrax.ckpt as ckpt
from cerebrax.errors import CheckpointError

pytestmark = pytest.mark.skipif(os.name == "nt", reason="SIGKILL is POSIX")

ROOT = Path(__file__).resolve().parents[2]
LAYERS = 64  # 64 arrays of 2 MiB

_CHILD = r"""
import os, signal, sys
import numpy as np
import cerebrax.ckpt as ckpt
from cerebrax.ckpt import _save

path, mode, background = sys.argv[1], sys.argv[2], sys.argv[3] == "background"
state = {f"layer{i}": np.full(1 << 19, i, np.float32) for i in range(LAYERS)}
state["step"] = 2

def die(*args):
    os.kill(os.getpid(), signal.SIGKILL)

kind, _, arg = mode.partition(":")
if kind == "leaves":  # killed after writing int(arg) arrays
    write_leaf, written = _save._write_leaf, []
    def counting(*args):
        if len(written) == int(arg):
            die()
        written.append(1)
        return write_leaf(*args)
    _save._write_leaf = counting
elif kind == "seal":  # the HDF5 file is complete and closed, the seal not yet written
    _save.write_seal = die
elif kind == "fsync":  # the file is sealed, not yet flushed to disk
    _save._fsync = die
elif kind == "replace":  # flushed, not yet renamed
    os.replace = die
elif kind == "renamed":  # renamed, the directory not yet flushed
    _save._fsync_directory = die
print("saving", flush=True)
if background:  # the main thread goes on while the writer thread is killed
    handle = ckpt.save(state, path, background=True)
    state["layer0"][:] = -1  # changed after the call: not what is saved
    handle.wait()
else:
    ckpt.save(state, path)
print("saved", flush=True)
""".replace("LAYERS", str(LAYERS))

_PREVIOUS = {"layer0": np.arange(10, dtype=np.float32), "step": 1}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _is_new(path: Path) -> bool:
    tree = ckpt.load(path)
    return tree["step"] == 2 and all(
        np.array_equal(np.asarray(tree[f"layer{i}"]), np.full(1 << 19, i, np.float32))
        for i in range(LAYERS)
    )


def _is_previous(path: Path, digest: str) -> bool:
    tree = ckpt.load(path, map_location="cache")
    return _digest(path) == digest and tree["step"] == 1 and np.array_equal(
        tree["layer0"], _PREVIOUS["layer0"])


def _run_child(path: Path, mode: str, how: str) -> int:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), mode, how], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "saving\n", child.stderr.read()
        if mode.startswith("after_ms:"):
            time.sleep(int(mode.partition(":")[2]) / 1000)
            child.send_signal(signal.SIGKILL)  # a no-op if the save already finished
        return child.wait(timeout=120)
    finally:
        child.kill()
        child.communicate()


_MODES = ["leaves:0", "leaves:31", "seal", "fsync", "replace", "renamed",
          "after_ms:5", "after_ms:20", "after_ms:60", "after_ms:150"]
# A background save runs the same steps in its writer thread: a few of them suffice.
_BACKGROUND_MODES = ["leaves:31", "seal", "replace", "renamed", "after_ms:20", "after_ms:150"]


@pytest.mark.parametrize(
    ("mode", "how"),
    [(mode, "sync") for mode in _MODES]
    + [(mode, "background") for mode in _BACKGROUND_MODES],
)
def test_killed_save_keeps_the_previous_checkpoint(tmp_path: Path, mode: str,
                                                   how: str) -> None:
    path = tmp_path / "checkpoint.h5"
    ckpt.save(_PREVIOUS, path)
    before = _digest(path)

    returncode = _run_child(path, mode, how)

    if not mode.startswith("after_ms:"):
        assert returncode == -signal.SIGKILL
    if mode == "renamed":
        assert _is_new(path)
    elif mode.startswith("after_ms:"):  # killed at any moment, or not at all
        assert _is_previous(path, before) or _is_new(path)
    else:
        assert _is_previous(path, before)

    leftovers = sorted(p for p in tmp_path.iterdir() if p != path)
    for temp in leftovers:
        assert temp.name.startswith(".checkpoint.h5.tmp-"), temp
        if mode.startswith(("leaves", "seal")):  # unfinished files are refused
            assert not ckpt.is_checkpoint(temp)
            with pytest.raises(CheckpointError, match=str(temp)):
                ckpt.load(temp)
    assert sorted(ckpt.clean_temporary_files(tmp_path)) == [str(p) for p in leftovers]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.h5"]


def test_cleaning_spares_files_of_running_writers(tmp_path: Path) -> None:
    mine = tmp_path / f".c.h5.tmp-{os.getpid()}-0123abcd"
    young = tmp_path / ".c.h5.tmp-999999999-0123abcd"  # a pid that cannot exist
    other = tmp_path / "notes.tmp-1-0123abcd"  # not a name save uses
    for file in (mine, young, other):
        file.write_bytes(b"x")
    assert ckpt.clean_temporary_files(tmp_path, min_age=3600) == []
    assert ckpt.clean_temporary_files(tmp_path) == [str(young)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, other.name])
