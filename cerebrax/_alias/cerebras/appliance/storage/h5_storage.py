"""``cerebras.appliance.storage.h5_storage``: cerebrax's minimal stand-in for the H5 file
storage of Cerebras' appliance package, present only under the cstorch alias.

A local path (no ``scheme://``) is an H5 checkpoint file, as cerebrax's (and cstorch's)
checkpoints are. Model Zoo asks :class:`H5Writer` whether an output folder is local,
reads a checkpoint's size, time and metadata with :class:`H5Reader`
(``cerebras-modelzoo checkpoint info``) and deletes old checkpoints with ``H5Deleter``
(through ``StorageDeleter.get(path).delete()``).
"""

from __future__ import annotations

import os
import re
from typing import Any

import h5py
import numpy as np

from .base_storage import PathLike, StorageDeleter, StorageReader, StorageWriter

__all__ = ["H5Deleter", "H5Reader", "H5Writer"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")  # s3://..., gs://..., (not C:/...)


class _H5Path:
    """A local file path."""

    @classmethod
    def is_valid_path(cls, path: PathLike) -> bool:
        return _URL.match(os.fspath(path)) is None

    @classmethod
    def path_exists(cls, path: PathLike) -> bool:
        return os.path.exists(path)


def _plain(value: Any) -> Any:
    """An H5 attribute value as a Python value (numpy scalars and arrays, bytes)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    return value


class H5Reader(_H5Path, StorageReader):
    """Reads an H5 checkpoint file: ``fstat`` (its :func:`os.stat`) and
    ``global_metadata`` (the file's root attributes).

    Raises:
      FileNotFoundError: ``path`` does not exist.
    """

    def __init__(self, path: PathLike) -> None:
        super().__init__(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"No H5 checkpoint file {self.path!r}.")

    @property
    def fstat(self) -> os.stat_result:
        """The file's :func:`os.stat` (size ``st_size``, time ``st_mtime``)."""
        return os.stat(self.path)

    @property
    def global_metadata(self) -> dict[str, Any]:
        """The file's root attributes, name -> value (numbers, strings, lists)."""
        with h5py.File(self.path, "r", locking=False) as file:
            return {name: _plain(value) for name, value in file.attrs.items()}


class H5Writer(_H5Path, StorageWriter):
    """The writer of local H5 checkpoint paths. Model Zoo only asks it whether a path is
    local (``is_valid_path``) or taken (``path_exists``); cerebrax's ``save`` writes the
    files."""


class H5Deleter(_H5Path, StorageDeleter):
    """Deletes a local H5 checkpoint file."""

    def delete(self) -> None:
        """Removes the file (:func:`os.remove`)."""
        os.remove(self.path)
