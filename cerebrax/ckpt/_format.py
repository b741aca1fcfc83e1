"""The cerebrax H5 checkpoint format: names, versions, dtypes and the data digest.

Layout of a checkpoint file (format version ``1.1``):

* One root-level, contiguous, uncompressed dataset per array leaf, named by the
  leaf's dotted key (``model.fc.weight``, ``optimizer.state.0.exp_avg``). Inside a
  key, ``%`` is written ``%25`` and ``/`` is written ``%2F``; an empty key is
  written ``%``. Each dataset also carries the attributes ``dtype`` (logical dtype
  name, e.g. ``"bfloat16"``) and ``kind`` (``"jax"``, ``"numpy"``,
  ``"numpy_scalar"`` or ``"torch"``) for people reading the file with other
  tools. bfloat16, which HDF5 cannot describe, is stored as its ``uint16`` bits.
* Root attributes: ``__format_version__``, ``__cerebrax_version__``,
  ``__structure__`` (JSON of the tree, see below), ``__structure_digest__``
  (BLAKE2b-128 of the structure text) and ``__SUCCESS__``, written last.
* The structure is the source of truth for the tree. A node is one of
  ``{"dict": [[key, node], ...]}`` (keys keep their int or str type and their
  order), ``{"list": [node, ...]}``, ``{"tuple": [node, ...]}``,
  ``{"value": json_value}`` for ``None``/bool/int/float/str leaves, and
  ``{"array": dataset_name, "dtype": ..., "shape": [...], "kind": ...,
  "digest": ...}`` for array leaves, so a reader learns every shape and dtype
  without touching a dataset.
* ``digest`` (see :class:`Digest`) lets a reader detect damaged data: the stored
  bytes are split into 1 MiB blocks; each block, zero-padded to a multiple of
  4 KiB, is read as little-endian uint64 words in rows of 512; the 512 column
  sums (mod 2**64) of every block, then the byte count, are hashed with
  BLAKE2b-128. Any change confined to one 8-byte word is always caught; it is a
  check against damage, not against tampering.

* After HDF5 has closed the file, a seal is appended (see ``_seal.py``): a digest
  of all HDF5 metadata, which a reader checks before HDF5 parses anything, so a
  damaged file is refused instead of being handed to HDF5.

Format ``1.0`` files (no per-array metadata, digests or seal) are still read.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import ml_dtypes
import numpy as np

from cerebrax.errors import CheckpointError

#: The version of the H5 checkpoint format ``save`` writes (``load`` reads 1.0 and 1.1).
FORMAT_VERSION = "1.1"
READABLE_VERSIONS = ((1, 0), (1, 1))
SEALED_SINCE = (1, 1)  # files of this version on end with a seal (see _seal.py)

VERSION_ATTR = "__format_version__"
CEREBRAX_VERSION_ATTR = "__cerebrax_version__"
STRUCTURE_ATTR = "__structure__"
STRUCTURE_DIGEST_ATTR = "__structure_digest__"
SUCCESS_ATTR = "__SUCCESS__"
DTYPE_ATTR = "dtype"
KIND_ATTR = "kind"

KINDS = frozenset(["jax", "numpy", "numpy_scalar", "torch"])
SUPPORTED_DTYPES = frozenset(
    ["bool", "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]
    + [f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)]
)

TEMP_MARKER = ".tmp-"  # temporary files are named ".<name>.tmp-<pid>-<random>"

PathLike = str | os.PathLike[str]
KeyPath = tuple[str | int, ...]

BLOCK_BYTES = 1 << 20  # digest block; also the unit of raw reads and writes
_ROW_WORDS = 512
_ROW_BYTES = 8 * _ROW_WORDS


def logical_dtype(name: str) -> np.dtype:
    """The numpy dtype of a supported dtype name (bfloat16 from ml_dtypes)."""
    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def stored_dtype(name: str) -> np.dtype:
    """The dtype HDF5 holds for a logical dtype: bfloat16 lives as uint16 bits."""
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


def parse_version(text: str, path: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        raise CheckpointError(
            f"Checkpoint {path!r} has an unreadable format version {text!r}."
        ) from None


def text_digest(text: str) -> str:
    """The BLAKE2b-128 hex digest of a metadata string."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


class Digest:
    """The incremental data digest of the format (see the module docstring).

    Feed the stored bytes with :meth:`update` in pieces of exactly
    :data:`BLOCK_BYTES` (the last piece may be shorter), then call
    :meth:`hexdigest`. Each piece is summed right after it was read or written,
    while it is still in the CPU cache.
    """

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self._nbytes = 0
        self._tail = False

    def update(self, piece: np.ndarray) -> None:
        """Adds one block: a 1-D uint8 array of at most ``BLOCK_BYTES`` bytes."""
        if self._tail:
            raise ValueError("only the last piece may be shorter than a block")
        size = piece.shape[0]
        self._nbytes += size
        if size % _ROW_BYTES:
            self._tail = True
            padded = np.zeros(-(-size // _ROW_BYTES) * _ROW_BYTES, np.uint8)
            padded[:size] = piece
            piece = padded
        if piece.shape[0]:
            words = piece.view("<u8").reshape(-1, _ROW_WORDS)
            self._hash.update(words.sum(axis=0, dtype="<u8").tobytes())

    def hexdigest(self) -> str:
        final = self._hash.copy()
        final.update(self._nbytes.to_bytes(8, "little"))
        return final.hexdigest()


def array_digest(data: np.ndarray) -> str:
    """The digest of a whole C-contiguous array's bytes."""
    digest = Digest()
    raw = byte_view(data)
    for start in range(0, raw.shape[0], BLOCK_BYTES):
        digest.update(raw[start : start + BLOCK_BYTES])
    return digest.hexdigest()


def byte_view(array: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a 1-D uint8 view (no copy)."""
    return array.reshape(-1).view(np.uint8)


def escape(key: str | int) -> str:
    text = str(key).replace("%", "%25").replace("/", "%2F")
    return text or "%"


def dotted(path: KeyPath) -> str:
    return ".".join(str(key) for key in path)


def brackets(path: KeyPath) -> str:
    return "".join(f"[{key!r}]" for key in path)


def cerebrax_version() -> str:
    from cerebrax._version import __version__

    return str(__version__)


def describe(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"
