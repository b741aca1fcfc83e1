"""Conversion between cerebrax H5 checkpoints and torch ``.pt`` files."""

from __future__ import annotations

import os

from ._format import PathLike
from ._lazy import _import_torch, to_torch
from ._load import load
from ._save import atomic_write, save
from ._torch_file import read_torch_file


def convert_torch_to_h5(src: PathLike, dst: PathLike) -> None:
    """Writes the state dict of the torch file ``src`` as an H5 checkpoint ``dst``.

    ``src`` is read with ``torch.load(weights_only=True)``, which rebuilds only
    tensors, containers and plain values and refuses any other pickled object, so
    a malicious file cannot run code. Tensors keep their dtype (bfloat16
    included) and the nesting of dicts, lists and tuples is kept.

    Raises:
      CheckpointError: ``src`` is missing, is not a torch file, holds objects
        that ``weights_only`` refuses, or holds a value the H5 format cannot store
        (the message names its key).
    """
    save(read_torch_file(os.fspath(src)), dst)


def convert_h5_to_torch(src: PathLike, dst: PathLike) -> None:
    """Writes the H5 checkpoint ``src`` as a torch file ``dst`` (``torch.save``).

    Every array becomes a ``torch.Tensor`` with the same dtype and shape
    (bfloat16 included; saved numpy scalars become 0-d tensors); containers and
    plain values are kept, so ``torch.load(dst, weights_only=True)`` reads it.
    ``dst`` is written atomically, like :func:`save`.

    Raises:
      CheckpointError: ``src`` is not a readable checkpoint, or ``dst`` cannot
        be written.
    """
    torch = _import_torch()
    tree = to_torch(load(src))
    atomic_write(os.path.abspath(os.fspath(dst)), lambda temp: torch.save(tree, temp))
