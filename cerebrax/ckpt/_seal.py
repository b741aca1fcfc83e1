"""The seal: a trailer that lets a reader check a file's HDF5 metadata before HDF5 parses it.

HDF5 does not survive every damaged file gracefully (a flipped byte in an attribute
can send it into an endless loop), so a checkpoint ends with a seal, appended after
HDF5 closed the file::

    [HDF5 file][seal JSON][u64 LE: JSON length][16 bytes: BLAKE2b-128 of the JSON][magic]

The JSON holds the format version, the end of the HDF5 part and the byte ranges of
the array data; ``metadata`` is the BLAKE2b-128 digest of every other byte of the
HDF5 part (superblock, object headers, attributes, small datasets). Array data is
checked by its own digest when it is read, so verifying a seal reads only metadata:
its cost does not grow with the size of the arrays. HDF5 ignores bytes after its end
of file, and a tool that rewrites the file drops the seal.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import NamedTuple

import h5py

from cerebrax.errors import CheckpointError

MAGIC = b"CBXSEAL\x01"
_TAIL = 8 + 16 + len(MAGIC)
_READ = 1 << 20

Range = tuple[int, int]  # (offset, length)


class Seal(NamedTuple):
    version: str  # the format version the writer recorded
    end: int  # where the HDF5 part of the file ends


def write_seal(path: str, version: str, data: list[Range] | None = None) -> None:
    """Appends a seal to the closed HDF5 file at ``path``.

    ``data`` lists the array-data ranges the writer put in the file; without it they
    are found by reading the file with h5py (for tests that edit a file and reseal
    it).
    """
    if data is None:
        data = _data_ranges(path)
    data = sorted((int(offset), int(length)) for offset, length in data if length)
    with open(path, "r+b") as file:
        end = file.seek(0, os.SEEK_END)
        metadata = _metadata_digest(file.fileno(), end, data)
        text = json.dumps({"format_version": version, "end": end, "data": data,
                           "metadata": metadata}).encode()
        file.write(text + len(text).to_bytes(8, "little") + _digest(text) + MAGIC)


def read_seal(fd: int, path: str) -> Seal | None:
    """Checks the seal of the open file ``fd``; None when the file has none.

    Raises:
      CheckpointError: The seal is there but the file does not match it.
    """
    try:
        return _read_seal(fd, path)
    except OSError as error:
        raise CheckpointError(f"Cannot read checkpoint {path!r}: {error}") from error


def _read_seal(fd: int, path: str) -> Seal | None:
    size = os.fstat(fd).st_size
    if size < _TAIL:
        return None
    tail = pread(fd, _TAIL, size - _TAIL)
    if tail[-len(MAGIC):] != MAGIC:
        return None
    length = int.from_bytes(tail[:8], "little")
    if length > size - _TAIL:
        raise _damaged(path, "its seal is cut short")
    text = pread(fd, length, size - _TAIL - length)
    if _digest(text) != tail[8:24]:
        raise _damaged(path, "its seal does not match its own digest")
    try:
        record = json.loads(text)
        version, end, metadata = record["format_version"], record["end"], record["metadata"]
        data = [(int(offset), int(length)) for offset, length in record["data"]]
        valid = (isinstance(version, str) and end == size - _TAIL - length
                 and _ranges_ok(data, end))
    except (ValueError, TypeError, KeyError) as error:
        raise _damaged(path, f"its seal cannot be read ({error})") from error
    if not valid:
        raise _damaged(path, "its seal describes another file")
    if _metadata_digest(fd, end, data) != metadata:
        raise _damaged(path, "its HDF5 metadata does not match its seal")
    return Seal(version, end)


def _ranges_ok(data: list[Range], end: int) -> bool:
    position = 0
    for offset, length in data:
        if offset < position or length <= 0 or offset + length > end:
            return False
        position = offset + length
    return True


def _metadata_digest(fd: int, end: int, data: list[Range]) -> str:
    """The digest of the bytes in ``[0, end)`` outside the ``data`` ranges."""
    digest = hashlib.blake2b(digest_size=16)
    position = 0
    for offset, length in [*data, (end, 0)]:
        while position < offset:
            piece = pread(fd, min(_READ, offset - position), position)
            if not piece:
                raise OSError("unexpected end of file")
            digest.update(piece)
            position += len(piece)
        position = offset + length
    return digest.hexdigest()


def _data_ranges(path: str) -> list[Range]:
    ranges = []
    with h5py.File(path, "r", locking=False) as file:
        for dataset in file.values():
            if isinstance(dataset, h5py.Dataset) and dataset.id.get_offset() is not None:
                ranges.append((dataset.id.get_offset(), dataset.id.get_storage_size()))
    return ranges


def pread(fd: int, size: int, offset: int) -> bytes:
    """Reads up to ``size`` bytes at ``offset`` (POSIX pread, or seek and read)."""
    if hasattr(os, "pread"):
        return os.pread(fd, size, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, size)


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _damaged(path: str, what: str) -> CheckpointError:
    return CheckpointError(f"Checkpoint {path!r} is damaged: {what}.")
