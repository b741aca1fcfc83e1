"""Reading checkpoints: ``load`` (lazy by default) and ``is_checkpoint``. No pickle."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import h5py
import numpy as np

from cerebrax.errors import CheckpointError

from .._runtime import RUNTIME

from ._background import WRITER
from ._format import (
    CEREBRAX_VERSION_ATTR,
    DTYPE_ATTR,
    FORMAT_VERSION,
    KIND_ATTR,
    KINDS,
    READABLE_VERSIONS,
    SEALED_SINCE,
    STRUCTURE_ATTR,
    STRUCTURE_DIGEST_ATTR,
    SUCCESS_ATTR,
    SUPPORTED_DTYPES,
    VERSION_ATTR,
    PathLike,
    parse_version,
    text_digest,
)
from ._flatten import torch_to_numpy
from ._lazy import ArrayInfo, LazyArray, Source, to_torch
from ._seal import Seal, read_seal
from ._torch_file import is_torch_file, read_torch_file

_MAP_LOCATIONS = (
    "None (lazy arrays), 'cache' or 'cpu' (numpy arrays) or 'jax' (jax arrays)"
)


def load(path: PathLike, map_location: str | None = None, *,
         return_torch: bool | None = None) -> Any:
    """Reads a checkpoint written by :func:`save`, or a torch file. Never runs its code.

    Containers come back as ``dict``/``list``/``tuple`` with the saved keys (int
    keys stay int) and order; non-array leaves come back as the saved Python
    values. Opening reads metadata only (the seal check covers the HDF5 metadata;
    array data is read on use), so its cost grows with the number of arrays, not
    with their size: a 10 MB and a 100 GB checkpoint with the same keys open
    equally fast. A later :func:`save` to the same path does not disturb the lazy
    arrays: they keep reading the file they came from (on Windows, where that
    file cannot be replaced while open, the save reads them into memory first).
    A background save to ``path`` that is still being written is waited for (its
    error, if any, is left for :func:`wait` or the next save to raise).

    Args:
      path: The checkpoint file.
      map_location: ``None``: every array is a :class:`LazyArray` that reads its
        data when used (``np.asarray(x)``, ``model.load_state_dict(state)``) and
        checks it against the digest saved with it; the file stays open until
        the last of them is garbage-collected. ``"cache"`` or ``"cpu"``: every
        array is read now as a numpy array (bfloat16 as ``ml_dtypes.bfloat16``;
        saved numpy scalars as numpy scalars) and the file is closed. ``"jax"``:
        the same, as jax arrays with the saved dtype; a 64-bit array is refused
        unless ``jax_enable_x64`` is on, rather than silently narrowed.
      return_torch: ``True``: every array comes back as a ``torch.Tensor`` (read
        now), as cstorch's ``load`` gives them, so that torch code such as
        ``state[k].t()`` runs on them. ``False``: torch files give numpy arrays.
        ``None`` (the default): each format as it is, a cerebrax checkpoint's
        arrays lazy (see ``map_location``), a torch file's tensors torch tensors;
        under the cstorch alias (``cerebrax run``, :func:`cerebrax.enable_cstorch_alias`)
        ``True``, as cstorch code expects.

    Returns:
      The saved tree.

    A file written by ``torch.save`` (a zip archive or a bare pickle) is read with
    ``torch.load(path, weights_only=True)``, which rebuilds tensors, containers and
    plain values only and refuses any other pickled object, so no code in the file
    ever runs; zip-format files are memory-mapped (tensors read the file on use).
    Such a file's tensors come back as torch tensors on the CPU (``map_location``
    ``None``, ``"cpu"`` or ``"cache"``) or as jax arrays (``"jax"``).

    Raises:
      CheckpointError: A missing file, a file that is neither a cerebrax checkpoint
        nor a torch file, a partially written, truncated or damaged one, one from a
        newer format version, a torch file holding objects that ``weights_only``
        refuses, or an unsupported ``map_location``. Damaged array data raises
        when the array is read.

    Example:
      >>> import numpy as np, cerebrax.ckpt as ckpt
      >>> ckpt.save({"model": {"w": np.ones((2, 3))}, "step": 3}, "/tmp/load_doc.h5")
      >>> state = ckpt.load("/tmp/load_doc.h5")
      >>> state["step"], state["model"]["w"].shape
      (3, (2, 3))
      >>> np.asarray(state["model"]["w"]).sum()  # reads the array now
      np.float64(6.0)
    """
    path = os.fspath(path)
    to_target = _target_converter(map_location)
    if return_torch is None and map_location != "jax" and RUNTIME.cstorch_alias:
        return_torch = True  # cstorch code (cerebrax run): torch tensors, as cstorch
    if is_torch_file(path):
        return _load_torch_file(path, map_location, return_torch)
    if return_torch:
        return to_torch(load(path, map_location, return_torch=False))
    WRITER.settle(path)  # a background save to this path finishes first
    file, version = _open_checkpoint(path)
    try:
        structure = _read_structure(file, path)
        source = Source(path, file)
    except BaseException:
        file.close()
        raise

    def read_leaf(node: dict, key: str) -> Any:
        array = LazyArray(source, _array_info(node, key, version, file, path))
        return array if to_target is None else to_target(array)

    try:
        return _decode(structure, read_leaf, path, ())
    finally:
        if to_target is not None:
            source.close()  # everything was read


def _load_torch_file(path: str, map_location: Any, return_torch: bool | None) -> Any:
    """A torch file's tree: torch tensors, numpy arrays (``return_torch=False``) or jax
    arrays (``map_location="jax"``)."""
    tree = read_torch_file(path)
    if map_location == "jax":
        if return_torch:
            raise CheckpointError(
                "load: return_torch=True asks for torch tensors and map_location='jax' "
                "for jax arrays; pass one of them."
            )
        return _map_tensors(tree, lambda t, key: _jax_array(_tensor_numpy(t), key), ())
    if return_torch is False:
        return _map_tensors(tree, lambda t, key: _tensor_numpy(t), ())
    return tree


def _map_tensors(tree: Any, fn: Callable[[Any, str], Any], keys: tuple) -> Any:
    """``tree`` with ``fn(tensor, dotted key)`` in place of every torch tensor."""
    import torch

    if isinstance(tree, torch.Tensor):
        return fn(tree, ".".join(map(str, keys)))
    if isinstance(tree, dict):
        return {k: _map_tensors(v, fn, (*keys, k)) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [_map_tensors(v, fn, (*keys, i)) for i, v in enumerate(tree)]
        return items if isinstance(tree, list) else tuple(items)
    return tree


def _tensor_numpy(tensor: Any) -> np.ndarray:
    """A numpy copy of a CPU tensor (bfloat16 as ``ml_dtypes.bfloat16``)."""
    return np.array(torch_to_numpy(tensor))  # a copy: the tensor may map the file


def is_checkpoint(path: PathLike) -> bool:
    """Whether ``path`` is a complete cerebrax checkpoint this version can read.

    Only the root metadata is read, never array data.
    """
    try:
        file, _ = _open_checkpoint(os.fspath(path))
    except CheckpointError:
        return False
    try:
        _read_structure(file, os.fspath(path))
    except CheckpointError:
        return False
    finally:
        file.close()
    return True


# --------------------------------------------------------------------------- header


def _open_checkpoint(path: str) -> tuple[h5py.File, tuple[int, ...]]:
    """Checks the seal of ``path``, opens it and checks its root attributes.

    The caller closes the file. The seal is checked first, on the same file HDF5
    then opens, so HDF5 never parses damaged metadata of a sealed file.
    """
    for _ in range(3):  # a save may replace the file between the two opens
        fd = _open_fd(path)
        try:
            seal = read_seal(fd, path)
            file = _open_hdf5(path)
            if _same_file(fd, file):
                break
            file.close()
        finally:
            os.close(fd)
    else:
        raise CheckpointError(f"Cannot read checkpoint {path!r}: it keeps being replaced.")
    try:
        version = _check_header(file.attrs, path, seal)
    except CheckpointError:
        file.close()
        raise
    except Exception as error:  # a damaged file can fail anywhere inside HDF5
        file.close()
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: its root attributes cannot be read "
            f"({error})."
        ) from error
    return file, version


def _open_fd(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except FileNotFoundError as error:
        raise CheckpointError(f"No checkpoint at {path!r}: no such file.") from error
    except OSError as error:  # a directory, no permission, ...
        raise CheckpointError(f"Cannot read checkpoint {path!r}: {error}") from error


def _open_hdf5(path: str) -> h5py.File:
    try:
        # No file locks: a checkpoint is never written in place, and locks fail on
        # some network file systems.
        return h5py.File(path, "r", locking=False)
    except Exception as error:  # HDF5 reports bad files with assorted exceptions
        raise CheckpointError(
            f"{path!r} is not a cerebrax H5 checkpoint: it is not a readable HDF5 "
            f"file (not HDF5, truncated or damaged: {error})."
        ) from error


def _same_file(fd: int, file: h5py.File) -> bool:
    if os.name == "nt":
        return True  # an open file cannot be replaced there
    ours, theirs = os.fstat(fd), os.fstat(file.id.get_vfd_handle())
    return (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino)


def _check_header(attrs: h5py.AttributeManager, path: str,
                  seal: Seal | None) -> tuple[int, ...]:
    if VERSION_ATTR not in attrs:
        raise CheckpointError(_foreign_file_message(attrs, path))
    found = _text(attrs[VERSION_ATTR])
    version = parse_version(found, path)
    if version > parse_version(FORMAT_VERSION, path):
        writer = _text(attrs.get(CEREBRAX_VERSION_ATTR, "unknown"))
        raise CheckpointError(
            f"Checkpoint {path!r} uses format version {found} (written by cerebrax "
            f"{writer}), newer than format version {FORMAT_VERSION} that this "
            "cerebrax reads. Upgrade cerebrax to load it."
        )
    if version not in READABLE_VERSIONS:
        raise CheckpointError(f"Checkpoint {path!r} has an unknown format version {found}.")
    success = attrs.get(SUCCESS_ATTR, False)
    if not (isinstance(success, (bool, np.bool_)) and success):
        raise CheckpointError(
            f"Cannot load partially written checkpoint at {path!r}: the "
            f"{SUCCESS_ATTR!r} marker is missing, so the save that wrote it did not "
            "finish. Load an earlier checkpoint or save again."
        )
    if seal is None and version >= SEALED_SINCE:
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: the seal that ends every checkpoint "
            "is missing, so the file was cut short or rewritten by another program."
        )
    if seal is not None and seal.version != found:
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: its seal records format version "
            f"{seal.version}, its attributes {found}."
        )
    if STRUCTURE_ATTR not in attrs:
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: its {STRUCTURE_ATTR!r} attribute is missing."
        )
    return version


def _foreign_file_message(attrs: h5py.AttributeManager, path: str) -> str:
    message = (
        f"{path!r} is not a cerebrax H5 checkpoint: the HDF5 file has no "
        f"{VERSION_ATTR!r} attribute. Only files written by cerebrax.ckpt.save can "
        "be loaded."
    )
    if "__version__" in attrs or "__spec__" in attrs:
        message += (
            " It looks like a checkpoint of the Cerebras PyTorch API; its tree "
            "description is a pickle, which cerebrax never loads. Export it with "
            "that API as a torch file (torch.save of the loaded state dict), then "
            "run: python -m cerebrax.ckpt to-h5 FILE.pt FILE.h5"
        )
    return message


def _text(value: Any) -> str:
    """An attribute value as text; bytes and other objects are never interpreted."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    raise TypeError(f"expected a string attribute, found {type(value).__name__}")


def _read_structure(file: h5py.File, path: str) -> dict:
    try:
        text = _text(file.attrs[STRUCTURE_ATTR])
        expected = file.attrs.get(STRUCTURE_DIGEST_ATTR)
        if expected is not None and text_digest(text) != _text(expected):
            raise CheckpointError(
                f"Checkpoint {path!r} is damaged: its {STRUCTURE_ATTR!r} attribute "
                "does not match the digest saved with it."
            )
        return json.loads(text)
    except CheckpointError:
        raise
    except Exception as error:  # undecodable text, bad JSON, unreadable attribute
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: {STRUCTURE_ATTR!r} cannot be read "
            f"({error})."
        ) from error


# ------------------------------------------------------------------------ structure


def _array_info(node: dict, key: str, version: tuple[int, ...], file: h5py.File,
                path: str) -> ArrayInfo:
    name = node["array"]
    if not isinstance(name, str):
        raise CheckpointError(f"Checkpoint {path!r} is damaged: bad array at key {key!r}.")
    if version == (1, 0):  # no metadata in the structure: read it from the dataset
        return _legacy_array_info(file, name, key, path)
    fields = [node.get(field) for field in ("dtype", "shape", "kind", "digest")]
    dtype, shape, kind, digest = fields
    if not (dtype in SUPPORTED_DTYPES and kind in KINDS and isinstance(digest, str)
            and isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: bad array metadata at key {key!r}: {node!r}."
        )
    return ArrayInfo(name, key, dtype, tuple(shape), kind, digest)


def _legacy_array_info(file: h5py.File, name: str, key: str, path: str) -> ArrayInfo:
    try:
        dataset = file[name]
        dtype = _text(dataset.attrs.get(DTYPE_ATTR, np.dtype(dataset.dtype).name))
        kind = _text(dataset.attrs.get(KIND_ATTR, "numpy"))
        shape = tuple(int(n) for n in dataset.shape)
    except Exception as error:  # missing or unreadable dataset
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: the dataset {name!r} named in its "
            f"structure cannot be read ({error})."
        ) from error
    if dtype not in SUPPORTED_DTYPES or kind not in KINDS:
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: dataset {name!r} records dtype {dtype!r} "
            f"and kind {kind!r}."
        )
    return ArrayInfo(name, key, dtype, shape, kind, None)


def _decode(node: Any, read_leaf: Callable[[dict, str], Any], path: str,
            keys: tuple) -> Any:
    if isinstance(node, dict) and "array" in node:
        return read_leaf(node, ".".join(map(str, keys)))
    try:
        ((tag, payload),) = node.items()
        if tag == "value" and (payload is None or isinstance(payload, (bool, int, float, str))):
            return payload
        if tag == "dict":
            return {_key(k): _decode(v, read_leaf, path, (*keys, k)) for k, v in payload}
        if tag in ("list", "tuple"):
            items = [_decode(v, read_leaf, path, (*keys, i)) for i, v in enumerate(payload)]
            return items if tag == "list" else tuple(items)
    except CheckpointError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: bad structure at key "
            f"{'.'.join(map(str, keys))!r} ({error})."
        ) from error
    raise CheckpointError(
        f"Checkpoint {path!r} is damaged: unknown structure node at key "
        f"{'.'.join(map(str, keys))!r}."
    )


def _key(key: Any) -> str | int:
    if type(key) is str or type(key) is int:
        return key
    raise TypeError(f"dict key {key!r} is neither str nor int")


# ------------------------------------------------------------------------- targets


def _target_converter(map_location: Any) -> Callable[[LazyArray], Any] | None:
    if map_location is None:
        return None
    if map_location in ("cache", "cpu"):
        return LazyArray.numpy
    if map_location == "jax":
        return _to_jax
    raise CheckpointError(
        f"load: map_location={map_location!r} is not supported; use {_MAP_LOCATIONS}."
    )


def _to_jax(array: LazyArray) -> Any:
    return _jax_array(array.numpy(), array.key)


def _jax_array(values: np.ndarray, key: str) -> Any:
    import jax
    import jax.numpy as jnp

    if jax.dtypes.canonicalize_dtype(values.dtype) != values.dtype:
        raise CheckpointError(
            f"Cannot load {key!r} as a jax array: its dtype {values.dtype.name} "
            "needs jax_enable_x64 (jax would narrow it). Enable it with "
            "jax.config.update('jax_enable_x64', True), or load with "
            "map_location='cpu' and convert yourself."
        )
    return jnp.asarray(values)  # host -> device copy
