"""Lazy array leaves: an open checkpoint file and the arrays read from it on access; what
kind of array a leaf is, and a tree's arrays as torch tensors (a lazy array given to a
torch function is read as one)."""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any

import h5py
import numpy as np

from cerebrax._runtime import RUNTIME
from cerebrax.errors import CheckpointError

from ._format import BLOCK_BYTES, Digest, array_digest, byte_view, logical_dtype, stored_dtype

# Where POSIX positional reads exist, array bytes are read straight into the result
# and summed block by block while in cache; elsewhere HDF5 reads them.
RAW_READS = hasattr(os, "preadv") and os.name != "nt"


class ArrayInfo:
    """Where an array leaf lives in the file and what it should look like."""

    __slots__ = ("name", "key", "dtype", "shape", "kind", "digest")

    def __init__(self, name: str, key: str, dtype: str, shape: tuple[int, ...], kind: str,
                 digest: str | None) -> None:
        self.name = name  # dataset name
        self.key = key  # dotted key, for messages
        self.dtype = dtype  # logical dtype name
        self.shape = shape
        self.kind = kind
        self.digest = digest  # None in format 1.0 files


class Source:
    """An open checkpoint file shared by the lazy arrays loaded from it.

    It stays open while any of its arrays is alive and closes when the last one is
    garbage-collected. On POSIX systems the open handle keeps the data readable
    even after a new save replaces the file at the same path. (Reopening the file
    for every read was measured too: about 0.08 ms more per read, +60% for a
    checkpoint of 1000 small arrays, and a replaced file would then be read in
    place of the loaded one.)
    """

    def __init__(self, path: str, file: h5py.File) -> None:
        self.path = path
        self._file = file
        self._fd = os.dup(file.id.get_vfd_handle()) if RAW_READS else -1
        self._size = os.fstat(self._fd).st_size if RAW_READS else None
        self._lock = threading.Lock()
        self._arrays: weakref.WeakValueDictionary[int, LazyArray] = (
            weakref.WeakValueDictionary()  # by id: arrays compare elementwise
        )
        self._finalizer = weakref.finalize(self, _close, file, self._fd)
        RUNTIME.open_checkpoints.add(self)

    def track(self, array: LazyArray) -> None:
        self._arrays[id(array)] = array

    def close(self) -> None:
        """Closes the file now; arrays not yet released cannot be read any more."""
        self._finalizer()

    def release(self) -> None:
        """Reads every live array into memory, then closes the file."""
        with self._lock:
            if not self._finalizer.alive:
                return
            for array in list(self._arrays.values()):
                try:
                    array._keep(self._read_locked(array.info))
                except CheckpointError as error:
                    array._keep(error)  # raised when the array is used
            self._finalizer()

    def read(self, info: ArrayInfo) -> np.ndarray:
        """Reads and checks one array; bfloat16 comes back as ml_dtypes.bfloat16."""
        with self._lock:
            if not self._finalizer.alive:
                raise CheckpointError(
                    f"Cannot read {info.key!r} from checkpoint {self.path!r}: the file "
                    "was closed. Load the checkpoint again."
                )
            return self._read_locked(info)

    def _read_locked(self, info: ArrayInfo) -> np.ndarray:
        dataset, offset = self._locate(info)
        out = np.empty(info.shape, dataset.dtype)
        if offset is not None:
            digest = self._read_raw(info, offset, byte_view(out))
        else:  # chunked, filtered, empty or 0-d data, or no raw reads: HDF5 reads
            try:
                if out.size:
                    h5py.Dataset(dataset).read_direct(out)
            except Exception as error:  # any failure inside HDF5 means a damaged file
                raise self._damaged(info, f"reading it failed ({error})") from error
            digest = array_digest(out)
        if info.digest is not None and digest != info.digest:
            raise self._damaged(info, "its data does not match the digest saved with it")
        if not out.dtype.isnative:
            out = out.astype(out.dtype.newbyteorder("="))
        return out.view(logical_dtype(info.dtype))

    def _locate(self, info: ArrayInfo) -> tuple[h5py.h5d.DatasetID, int | None]:
        """The dataset and, when its bytes can be read directly, their offset."""
        # The low-level API: h5py's high-level objects cost ~0.5 ms per dataset.
        try:
            try:
                dataset = h5py.h5d.open(self._file.id, info.name.encode())
            except KeyError:
                raise self._damaged(info, "its dataset is missing") from None
            found = (tuple(dataset.shape), np.dtype(dataset.dtype).newbyteorder("="))
            if found != (info.shape, stored_dtype(info.dtype)):
                raise self._damaged(
                    info, f"the structure says {info.dtype}{list(info.shape)} but the "
                    f"dataset holds {found[1].name}{list(found[0])}"
                )
            plist = dataset.get_create_plist()
            direct = (RAW_READS and plist.get_layout() == h5py.h5d.CONTIGUOUS
                      and plist.get_nfilters() == 0)
            offset = dataset.get_offset() if direct else None
        except CheckpointError:
            raise
        except Exception as error:  # any failure inside HDF5 means a damaged file
            raise self._damaged(info, f"reading its metadata failed ({error})") from error
        return dataset, offset

    def _read_raw(self, info: ArrayInfo, offset: int, raw: np.ndarray) -> str:
        """Reads the bytes at ``offset`` into ``raw`` and returns their digest."""
        if offset + raw.shape[0] > self._size:
            raise self._damaged(info, "the file ends before its data (truncated?)")
        digest = Digest()
        for start in range(0, raw.shape[0], BLOCK_BYTES):
            piece = raw[start : start + BLOCK_BYTES]
            done = 0
            while done < piece.shape[0]:
                got = os.preadv(self._fd, [piece[done:]], offset + start + done)
                if got <= 0:
                    raise self._damaged(info, "the file ends before its data (truncated?)")
                done += got
            digest.update(piece)
        return digest.hexdigest()

    def _damaged(self, info: ArrayInfo, what: str) -> CheckpointError:
        return CheckpointError(
            f"Checkpoint {self.path!r} is damaged: the array {info.key!r} (dataset "
            f"{info.name!r}) cannot be read: {what}."
        )


def _close(file: h5py.File, fd: int) -> None:
    try:
        file.close()
    finally:
        if fd >= 0:
            os.close(fd)


def release(path: str) -> None:
    """Reads into memory and closes every open checkpoint file at ``path``."""
    wanted = os.path.normcase(os.path.realpath(path))
    for source in list(RUNTIME.open_checkpoints):
        if os.path.normcase(os.path.realpath(source.path)) == wanted:
            source.release()


def _materialized(value: Any) -> Any:
    return value


class LazyArray(np.lib.mixins.NDArrayOperatorsMixin):
    """An array leaf of a loaded checkpoint, read from the file when used.

    Works wherever an array is accepted: ``np.asarray(x)``, ``jnp.asarray(x)``,
    numpy functions and arithmetic, torch functions (it is tensor-like: a plain
    torch module's ``load_state_dict`` accepts it), and the ``load_state_dict``
    methods of cerebrax. ``shape``, ``dtype``, ``ndim``,
    ``size`` and ``nbytes`` come from the checkpoint's metadata without a read.
    Each use reads the data again and checks it against the digest saved with
    it; nothing is cached, so memory stays bounded (``load(path,
    map_location="cache")`` reads everything once instead). Other numpy
    attributes (``x.view``, ``x.astype``, ``x.tolist()``, ...) read the array
    and forward to it. Pickling or deep-copying gives the plain numpy value.

    Example:
      >>> import numpy as np, cerebrax.ckpt as ckpt
      >>> ckpt.save({"w": np.arange(3.0)}, "/tmp/lazy_doc.h5")
      >>> w = ckpt.load("/tmp/lazy_doc.h5")["w"]
      >>> w.shape, float(np.sum(w * 2))
      ((3,), 6.0)
    """

    __slots__ = ("info", "_source", "_kept", "__weakref__")

    def __init__(self, source: Source, info: ArrayInfo) -> None:
        self.info = info
        self._source = source
        self._kept: np.ndarray | CheckpointError | None = None
        source.track(self)

    # ---- metadata, no read
    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return self.info.shape

    @property
    def dtype(self) -> np.dtype:
        """The array's numpy dtype (``ml_dtypes.bfloat16`` for bfloat16)."""
        return logical_dtype(self.info.dtype)

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.info.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(np.prod(self.info.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """The bytes the array takes in memory once read (``size * dtype.itemsize``)."""
        return self.size * self.dtype.itemsize

    @property
    def key(self) -> str:
        """The leaf's dotted key, e.g. ``"model.fc.weight"``."""
        return self.info.key

    @property
    def filename(self) -> str:
        """The path of the checkpoint file the array is read from."""
        return self._source.path

    # ---- reading
    def numpy(self) -> np.ndarray | np.generic:
        """Reads the array: a numpy array, or the numpy scalar that was saved."""
        array = self._read()
        return array[()] if self.info.kind == "numpy_scalar" else array

    def _read(self) -> np.ndarray:
        if isinstance(self._kept, CheckpointError):
            raise self._kept
        if self._kept is not None:
            return self._kept.copy()  # callers may write to what they get
        return self._source.read(self.info)  # reads from disk

    def _keep(self, value: np.ndarray | CheckpointError) -> None:
        self._kept = value

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self._read()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any):
        if any(isinstance(x, LazyArray) for x in kwargs.get("out", ())):
            raise TypeError("a LazyArray is read-only; it cannot be a ufunc output")
        inputs = tuple(np.asarray(x) if isinstance(x, LazyArray) else x for x in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        """torch reads a lazy array as a tensor: ``load_state_dict`` of a plain torch
        module, ``tensor.copy_(x)``, ``torch.equal(x, t)`` and other torch functions."""
        return func(*to_torch(tuple(args)), **to_torch(dict(kwargs or {})))

    def __len__(self) -> int:
        if not self.info.shape:
            raise TypeError("len() of a 0-d array")
        return self.info.shape[0]

    def __getitem__(self, index: Any) -> Any:
        return self._read()[index]

    def __iter__(self):
        return iter(self._read())

    def __bool__(self) -> bool:
        return bool(self._read())

    def __float__(self) -> float:
        return float(self._read())

    def __int__(self) -> int:
        return int(self._read())

    def __index__(self) -> int:
        return self._read().__index__()

    def __complex__(self) -> complex:
        return complex(self._read())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._read(), name)  # reads the array

    def __reduce__(self) -> tuple:
        return (_materialized, (self.numpy(),))

    def __repr__(self) -> str:
        return (
            f"LazyArray(key={self.key!r}, shape={self.shape}, dtype={self.dtype.name}, "
            f"file={self.filename!r})"
        )


def array_kind(node: Any) -> str | None:
    """What kind of array ``node`` is, or None for anything else."""
    if isinstance(node, LazyArray):
        return node.info.kind  # saved again as what it was saved as
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    if torch is not None and isinstance(node, torch.Tensor):
        return "torch"
    jax = sys.modules.get("jax")  # likewise for jax arrays
    if jax is not None and isinstance(node, jax.Array):
        return "jax"
    if isinstance(node, np.ndarray):
        return "numpy"
    if isinstance(node, np.generic):
        return "numpy_scalar"
    return None


def to_torch(tree: Any) -> Any:
    """A copy of ``tree`` with every array (lazy, numpy, jax) as a torch tensor.

    Example:
      >>> import numpy as np, cerebrax.ckpt as ckpt
      >>> ckpt.save({"w": np.ones(2, np.float16)}, "/tmp/to_torch_doc.h5")
      >>> ckpt.to_torch(ckpt.load("/tmp/to_torch_doc.h5"))["w"].dtype
      torch.float16
    """
    torch = _import_torch()
    if isinstance(tree, dict):
        return {key: to_torch(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [to_torch(value) for value in tree]
        return items if isinstance(tree, list) else tuple(items)
    if isinstance(tree, LazyArray) or array_kind(tree) in ("jax", "numpy", "numpy_scalar"):
        return _tensor(torch, np.array(tree))  # reads a lazy array; a writable copy
    return tree


def _tensor(torch: Any, array: np.ndarray) -> Any:
    if array.dtype.name == "bfloat16":  # torch has no numpy bf16: go through the bits
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as error:
        raise CheckpointError(
            "Converting to or from torch files needs torch: pip install torch"
        ) from error
    return torch
