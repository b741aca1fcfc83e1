"""Writing checkpoints: ``save`` and the atomic temporary-file-then-rename protocol."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable

import h5py
import numpy as np

from cerebrax.errors import CheckpointError

from . import _lazy
from ._background import WRITER, SaveHandle
from ._flatten import Leaf, flatten, to_host
from ._format import (
    BLOCK_BYTES,
    CEREBRAX_VERSION_ATTR,
    DTYPE_ATTR,
    FORMAT_VERSION,
    KIND_ATTR,
    STRUCTURE_ATTR,
    STRUCTURE_DIGEST_ATTR,
    SUCCESS_ATTR,
    TEMP_MARKER,
    VERSION_ATTR,
    Digest,
    PathLike,
    array_digest,
    byte_view,
    cerebrax_version,
    text_digest,
)
from ._seal import write_seal
from ._stage import BUFFERS, owned_host_arrays, start_host_copies

# A file that is open cannot be replaced on Windows; elsewhere a reader keeps the old
# file's data through its open handle while the name moves on to the new file.
CLOSE_BEFORE_REPLACE = os.name == "nt"
# Where POSIX positional writes exist, array bytes go straight to their place in the
# file (one copy, summed while in cache); elsewhere HDF5 writes them.
RAW_WRITES = hasattr(os, "pwrite") and os.name != "nt"

_TEMP_NAME = re.compile(
    r"^\.(?P<target>.+)" + re.escape(TEMP_MARKER) + r"(?P<pid>\d+)-[0-9a-f]{8}$"
)


def save(
    state_dict: dict | list | tuple, path: PathLike, *, background: bool = False
) -> SaveHandle | None:
    """Writes ``state_dict`` to an H5 checkpoint at ``path``, atomically.

    The tree is validated before anything touches the disk. The file is written
    to a temporary file in the same directory (``.<name>.tmp-<pid>-<random>``),
    flushed to disk and renamed onto ``path``, so a crash, a kill or an error
    mid-save leaves any previous file at ``path`` as it was. A save that fails
    with an exception removes its temporary file; a killed one may leave it
    behind, and :func:`clean_temporary_files` removes it.

    With ``background=True`` the arrays are copied to host memory before ``save``
    returns, so the step that follows may change them in place or donate their
    buffers: the checkpoint holds the values at the call. Writing, sealing,
    flushing and renaming the file then run in a background thread, with the same
    atomicity. At most one background save is pending: every save first waits for
    it, and so do :func:`wait`, :func:`load` of the same path and the end of the
    program. Its host copies take as much host memory as the arrays; their
    buffers are kept and reused by the next background save.

    Arrays loaded lazily from the file at ``path`` keep reading the old data after
    it is replaced (on Windows, where an open file cannot be replaced, they are
    read into memory first).

    Args:
      state_dict: Nested dicts (str or int keys), lists and tuples. Leaves are
        ``jax.Array``, numpy arrays and scalars, ``torch.Tensor`` and Python
        ``int``/``float``/``bool``/``str``/``None``. Dict, list and tuple
        subclasses (``OrderedDict``, named tuples) are saved as their base type.
      path: Where to write. Its directory must exist.
      background: Write the file in a background thread and return a handle to
        wait on, instead of writing it before returning (the default, as in
        ``torch.save``).

    Returns:
      None, or with ``background=True`` a :class:`SaveHandle` whose ``wait()``
      blocks until the file is in place and raises the write's error, if any.

    Raises:
      CheckpointError: An unsupported key, leaf or dtype (nothing is written),
        a missing directory, or an OS error while writing. A background write's
        error is raised later instead: by its handle's ``wait()``, by
        :func:`wait`, by the next save (which then saves nothing) or at exit;
        once, by whichever comes first (the handle raises it on every call).

    Example:
      >>> import numpy as np, cerebrax.ckpt as ckpt
      >>> ckpt.save({"model": {"w": np.ones(2)}, "step": 3}, "/tmp/doc.h5")
      >>> ckpt.load("/tmp/doc.h5")["step"]
      3
      >>> handle = ckpt.save({"step": 4}, "/tmp/doc.h5", background=True)
      >>> handle.wait()
      >>> ckpt.load("/tmp/doc.h5")["step"]
      4
    """
    target = os.path.abspath(os.fspath(path))
    structure, leaves = flatten(state_dict)
    _existing_directory(target)
    WRITER.wait()  # the previous background save first; raises its error
    if not background:
        start_host_copies(leaves)  # each leaf is waited for as it is written
        arrays = [None] * len(leaves)
        atomic_write(target, lambda temp: _write_file(temp, structure, leaves, arrays))
        return None
    arrays = owned_host_arrays(leaves)  # device -> host copies: a sync point

    def write() -> None:
        atomic_write(target, lambda temp: _write_file(temp, structure, leaves, arrays))
        BUFFERS.give_back(arrays)

    return WRITER.submit(target, write)


def atomic_write(target: str, write: Callable[[str], None]) -> None:
    """Calls ``write(temp)`` and, if it returns, moves ``temp`` onto ``target``.

    ``temp`` is a fresh name in the directory of ``target``; it is flushed to
    disk before the rename and the rename itself is made durable after it.
    """
    directory = _existing_directory(target)
    temp = _temporary_name(target)
    retired = None
    try:
        write(temp)
        _fsync(temp)
        if CLOSE_BEFORE_REPLACE:
            _lazy.release(target)
        retired = _retire(target)
        os.replace(temp, target)
    except BaseException as error:
        for name in (temp, retired):
            if name is not None:
                with contextlib.suppress(OSError):
                    os.remove(name)
        # HDF5 reports some failed writes and flushes (a full disk) as RuntimeError.
        if isinstance(error, (OSError, RuntimeError)):
            raise CheckpointError(f"Could not write checkpoint {target!r}: {error}") from error
        raise
    _fsync_directory(directory)
    if retired is not None:
        threading.Thread(target=_remove_quietly, args=(retired,), daemon=True,
                         name="cerebrax-retire").start()


def _temporary_name(target: str) -> str:
    """A fresh name next to ``target`` that :func:`clean_temporary_files` recognizes."""
    return os.path.join(
        os.path.dirname(target),
        f".{os.path.basename(target)}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}",
    )


def _retire(target: str) -> str | None:
    """A second link to the file at ``target`` (None if there is none, or no hard links).

    Replacing a big file frees its blocks inside the rename; with a second link the
    rename only swaps names, and the old data is freed in the background, by
    removing that link. A killed process leaves the link under a temporary name,
    which :func:`clean_temporary_files` removes.
    """
    if os.name == "nt" or not os.path.isfile(target):
        return None
    retired = _temporary_name(target)
    try:
        os.link(target, retired)
    except OSError:
        return None
    return retired


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def clean_temporary_files(directory: PathLike, *, min_age: float = 0.0) -> list[str]:
    """Removes the temporary files that killed saves left in ``directory``.

    A file is removed when its name is one :func:`save` gives its temporary file,
    the process that wrote it (the pid in the name) no longer runs on this
    machine, and it was last modified at least ``min_age`` seconds ago. On a file
    system shared by several machines, pass a ``min_age`` longer than any save
    takes, since a writer on another machine looks like a dead process here.
    Loading never mistakes these files for checkpoints: they are not at the
    checkpoint's path, and an unfinished one lacks the success marker.

    Returns:
      The paths that were removed.
    """
    directory = os.fspath(directory)
    removed = []
    now = time.time()
    for name in sorted(os.listdir(directory)):
        match = _TEMP_NAME.match(name)
        if match is None or _process_alive(int(match["pid"])):
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):  # gone, or still open on Windows
            if now - os.stat(path).st_mtime >= min_age:
                os.remove(path)
                removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process may be saving
    if os.name == "nt":
        return False  # a file still being written cannot be removed there
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _existing_directory(target: str) -> str:
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise CheckpointError(
            f"Cannot save checkpoint {target!r}: directory {directory!r} does not "
            f"exist. Create it first, e.g. os.makedirs({directory!r}, exist_ok=True)."
        )
    return directory


def _write_file(temp: str, structure: dict, leaves: list[Leaf],
                arrays: list[np.ndarray | None]) -> None:
    # libver >= v1.8 gives dense attribute storage, so a large __structure__ fits.
    # No file lock: nobody else opens a fresh temporary name, and locks fail on some
    # network file systems.
    with h5py.File(temp, "x", libver=("v108", "latest"), locking=False) as file:
        file.attrs[VERSION_ATTR] = FORMAT_VERSION
        file.attrs[CEREBRAX_VERSION_ATTR] = cerebrax_version()
        fd = file.id.get_vfd_handle() if RAW_WRITES else -1
        ranges = [_write_leaf(file, fd, leaf, array) for leaf, array in zip(leaves, arrays)]
        header = json.dumps(structure)  # complete now: every digest is in
        file.attrs[STRUCTURE_ATTR] = header
        file.attrs[STRUCTURE_DIGEST_ATTR] = text_digest(header)
        file.attrs[SUCCESS_ATTR] = True
    write_seal(temp, FORMAT_VERSION, [r for r in ranges if r is not None])


def _write_leaf(file: h5py.File, fd: int, leaf: Leaf,
                array: np.ndarray | None) -> tuple[int, int] | None:
    """Writes one array leaf as a root-level dataset and records its digest.

    ``array`` is its host value, or None to convert it now. Returns the
    ``(offset, length)`` of the bytes it wrote itself, if any.
    """
    if array is None:
        array = to_host(leaf)  # device -> host copy, or a read of a lazy array
    stored = array.view(np.uint16) if leaf.node["dtype"] == "bfloat16" else array
    dataset = file.create_dataset(leaf.name, shape=stored.shape, dtype=stored.dtype,
                                  dcpl=_contiguous_layout())
    dataset.attrs[DTYPE_ATTR] = leaf.node["dtype"]
    dataset.attrs[KIND_ATTR] = leaf.kind
    offset = dataset.id.get_offset() if RAW_WRITES else None
    if offset is not None:
        leaf.node["digest"] = _write_raw(fd, offset, byte_view(stored))
        return offset, stored.nbytes
    # No raw writes here, or no storage yet (0-d datasets): HDF5 writes the bytes,
    # and the seal covers them with the metadata.
    if stored.size:
        dataset.write_direct(stored)
    leaf.node["digest"] = array_digest(stored)
    return None


def _contiguous_layout() -> h5py.h5p.PropDCID:
    """Contiguous storage allocated at creation and never filled: its offset is
    known at once and the data is written once, by :func:`_write_raw`."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    return dcpl


def _write_raw(fd: int, offset: int, raw: np.ndarray) -> str:
    """Writes the bytes of a dataset at its file offset, block by block, and
    returns their digest (each block is summed while it is still in cache).

    Each written block is handed to the disk at once (:func:`_start_writeback`), so
    the disk writes while the next blocks are copied and the final fsync finds
    little left to flush.
    """
    digest = Digest()
    for start in range(0, raw.shape[0], BLOCK_BYTES):
        piece = raw[start : start + BLOCK_BYTES]
        view = memoryview(piece)
        written = 0
        while written < len(view):
            written += os.pwrite(fd, view[written:], offset + start + written)
        _start_writeback(fd, offset + start, len(view))
        digest.update(piece)
    return digest.hexdigest()


def _load_sync_file_range() -> Callable[[int, int, int], None] | None:
    """Linux's ``sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)``: starts the
    writeback of a range without waiting for it; None where it is not available."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    write = 2  # SYNC_FILE_RANGE_WRITE

    def start(fd: int, offset: int, n: int) -> None:
        function(fd, offset, n, write)  # advisory: a failure leaves it to the fsync

    return start


_SYNC_FILE_RANGE = _load_sync_file_range()


def _start_writeback(fd: int, offset: int, n: int) -> None:
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, n)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # flushes every dirty page of the file, whoever wrote it
    finally:
        os.close(fd)


def _fsync_directory(directory: str) -> None:
    """Makes the rename durable; skipped where directories cannot be opened."""
    if os.name == "nt":
        return
    try:
        _fsync(directory)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename is done
