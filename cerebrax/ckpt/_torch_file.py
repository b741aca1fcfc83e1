"""torch ``.pt`` files: recognizing them and reading them without running their code.

``cstorch.load`` opens cerebrax H5 checkpoints and, like cstorch, falls back to torch's
own format for files written by ``torch.save``. A torch file is a pickle (inside a zip
archive since torch 1.6), and unpickling can call any function the file names, so it
is read only with ``torch.load(weights_only=True)``: torch's restricted unpickler
rebuilds tensors, plain containers and plain values and refuses every other global.
A file that needs more is refused with a message that names the way out; cerebrax
never falls back to a full unpickle.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

from cerebrax.errors import CheckpointError

__all__ = ["is_torch_file", "read_torch_file"]

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_PICKLE_PROTO = b"\x80"  # a pickle of protocol 2 or later starts with PROTO

MSG_REFUSED = """\
Cannot load torch file {path!r} safely: torch.load(weights_only=True), which rebuilds
only tensors, containers and plain values and never runs code from the file, refused
it ({error}).
cerebrax never unpickles arbitrary objects. If you wrote this file yourself and trust
it, load it with torch.load(path, weights_only=False) in your own code and pass the
resulting state dict on; better, save plain state dicts of tensors
(torch.save(model.state_dict(), path)) or use cstorch.save."""


def is_torch_file(path: str) -> bool:
    """Whether ``path`` looks like a ``torch.save`` file (zip archive or bare pickle).

    Only the first bytes (and, for a zip archive, its member names) are read. An HDF5
    file, including a cerebrax checkpoint, is never taken for a torch file.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    if head.startswith(_HDF5_SIGNATURE):
        return False
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as archive:
                return any(name.endswith("data.pkl") for name in archive.namelist())
        except (OSError, zipfile.BadZipFile):
            return False
    return head.startswith(_PICKLE_PROTO) and len(head) > 1 and 2 <= head[1] <= 5


def read_torch_file(path: str) -> Any:
    """``torch.load(path, weights_only=True)`` onto the CPU, errors as CheckpointError.

    A zip-format file is memory-mapped (``mmap=True``): its tensors read the file on
    use instead of all being read now, as cerebrax's own lazy arrays do.

    Raises:
      CheckpointError: the file is missing, is not a torch file, or holds objects that
        the weights-only unpickler refuses (nothing of the file runs).
    """
    torch = _import_torch()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"No torch file at {path!r}: no such file.")
    mmap = zipfile.is_zipfile(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # torch reports bad and refused files with assorted types
        raise CheckpointError(MSG_REFUSED.format(path=path, error=_first_line(error))) \
            from error


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as error:
        raise CheckpointError(
            "Reading or writing torch files needs torch: pip install torch"
        ) from error
    return torch
