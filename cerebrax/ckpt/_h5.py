"""The cerebrax H5 checkpoint format: atomic ``save``, pickle-free ``load``.

Layout of a checkpoint file (format version ``1.0``):

* One root-level dataset per array leaf, named by the leaf's dotted key
  (``model.fc.weight``, ``optimizer.state.0.exp_avg``). Inside a key, ``%`` is
  written ``%25`` and ``/`` is written ``%2F``; an empty key is written ``%``.
* Each dataset carries two attributes: ``dtype`` (the logical dtype name, e.g.
  ``"bfloat16"``) and ``kind`` (what the leaf was: ``"jax"``, ``"numpy"``,
  ``"numpy_scalar"`` or ``"torch"``). bfloat16 data, which HDF5 cannot describe, is
  stored as its ``uint16`` bit pattern.
* Root attributes: ``__format_version__``, ``__cerebrax_version__``,
  ``__structure__`` (JSON of the tree: containers, dict keys with their int or str
  type, key order, non-array leaves, and the dataset name of each array leaf) and
  ``__SUCCESS__``, written last.

The structure JSON is the source of truth for the tree, so keys that contain
``"."`` (as a torch ``state_dict()`` has) are fine; only two leaves whose dotted
names coincide are refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import h5py
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from cerebrax.errors import CheckpointError

__all__ = ["FORMAT_VERSION", "is_checkpoint", "load", "save"]

FORMAT_VERSION = "1.0"

_VERSION_ATTR = "__format_version__"
_CEREBRAX_VERSION_ATTR = "__cerebrax_version__"
_STRUCTURE_ATTR = "__structure__"
_SUCCESS_ATTR = "__SUCCESS__"
_DTYPE_ATTR = "dtype"
_KIND_ATTR = "kind"

_SUPPORTED_DTYPES = frozenset(
    ["bool", "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]
    + [f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)]
)
_MAP_LOCATIONS = "None, 'cpu' (numpy arrays) or 'jax' (jax arrays)"

PathLike = str | os.PathLike[str]
KeyPath = tuple[str | int, ...]


class _Leaf(NamedTuple):
    """An array leaf waiting to be written."""

    name: str  # dataset name
    path: KeyPath  # where the leaf sits in the tree
    value: Any  # jax.Array, np.ndarray, np.generic or torch.Tensor
    kind: str  # "jax" | "numpy" | "numpy_scalar" | "torch"


# ----------------------------------------------------------------------------- save


def save(state_dict: dict | list | tuple, path: PathLike) -> None:
    """Writes ``state_dict`` to an H5 checkpoint at ``path``, atomically.

    The tree is validated before anything touches the disk. The file is written
    to a temporary file in the same directory, flushed to disk and renamed onto
    ``path``, so a crash or an error mid-save leaves any previous file at ``path``
    as it was and no temporary file behind.

    Args:
      state_dict: Nested dicts (str or int keys), lists and tuples. Leaves are
        ``jax.Array``, numpy arrays and scalars, ``torch.Tensor`` and Python
        ``int``/``float``/``bool``/``str``/``None``. Dict, list and tuple
        subclasses (``OrderedDict``, named tuples) are saved as their base type.
      path: Where to write. Its directory must exist.

    Raises:
      CheckpointError: An unsupported key, leaf or dtype (nothing is written),
        a missing directory, or an OS error while writing.

    Example:
      >>> import numpy as np, cerebrax.ckpt as ckpt
      >>> ckpt.save({"model": {"w": np.ones(2)}, "step": 3}, "/tmp/doc.h5")
      >>> ckpt.load("/tmp/doc.h5")["step"]
      3
    """
    target = os.path.abspath(os.fspath(path))
    structure, leaves = _flatten(state_dict)
    header = json.dumps(structure)
    directory = _existing_directory(target)
    temp = os.path.join(
        directory,
        f".{os.path.basename(target)}.tmp-{os.getpid()}-{secrets.token_hex(4)}",
    )
    try:
        _write_file(temp, header, leaves)
        _fsync(temp)
        os.replace(temp, target)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)
        if isinstance(error, OSError):
            raise CheckpointError(
                f"Could not write checkpoint {target!r}: {error}"
            ) from error
        raise
    _fsync_directory(directory)


def _existing_directory(target: str) -> str:
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise CheckpointError(
            f"Cannot save checkpoint {target!r}: directory {directory!r} does not "
            f"exist. Create it first, e.g. os.makedirs({directory!r}, exist_ok=True)."
        )
    return directory


def _write_file(temp: str, header: str, leaves: list[_Leaf]) -> None:
    # libver >= v1.8 gives dense attribute storage, so a large __structure__ fits.
    with h5py.File(temp, "x", libver=("v108", "latest")) as file:
        file.attrs[_VERSION_ATTR] = FORMAT_VERSION
        file.attrs[_CEREBRAX_VERSION_ATTR] = _cerebrax_version()
        file.attrs[_STRUCTURE_ATTR] = header
        for leaf in leaves:
            _write_array(file, leaf)
        file.attrs[_SUCCESS_ATTR] = True
        file.flush()


def _write_array(file: h5py.File, leaf: _Leaf) -> None:
    """Writes one array leaf as a root-level dataset."""
    array = _to_numpy(leaf)
    dtype = array.dtype.name
    stored = array.view(np.uint16) if dtype == "bfloat16" else array
    dataset = file.create_dataset(leaf.name, data=stored)
    dataset.attrs[_DTYPE_ATTR] = dtype
    dataset.attrs[_KIND_ATTR] = leaf.kind


def _to_numpy(leaf: _Leaf) -> np.ndarray:
    try:
        if leaf.kind == "torch":
            return _torch_to_numpy(leaf.value)
        array = np.asarray(leaf.value)  # device -> host copy for jax arrays
    except (TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(
            f"Cannot save the value at key {_dotted(leaf.path)!r}: converting it to "
            f"a host array failed ({error}). Save concrete arrays, not traced values."
        ) from error
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def _torch_to_numpy(tensor: Any) -> np.ndarray:
    torch = sys.modules["torch"]
    if tensor.layout != torch.strided:
        raise TypeError(f"only dense tensors can be saved, not {tensor.layout}")
    tensor = tensor.detach().cpu().resolve_conj().resolve_neg()
    if tensor.dtype == torch.bfloat16:  # numpy has no bf16: go through the bits
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


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


def _cerebrax_version() -> str:
    try:
        from cerebrax import __version__  # read lazily: may not exist yet
    except ImportError:
        return "unknown"
    return str(__version__)


# -------------------------------------------------------------------------- flatten


def _flatten(tree: Any) -> tuple[dict, list[_Leaf]]:
    """Validates ``tree`` and splits it into its JSON structure and array leaves."""
    if not isinstance(tree, (dict, list, tuple)):
        raise CheckpointError(
            f"save expects a state dict (a dict, list or tuple), got "
            f"{type(tree).__qualname__}. Wrap it, e.g. save({{'value': x}}, path)."
        )
    flattener = _Flattener()
    structure = flattener.encode(tree, ())
    return structure, list(flattener.leaves.values())


class _Flattener:
    """Walks a tree once, collecting array leaves by dataset name."""

    def __init__(self) -> None:
        self.leaves: dict[str, _Leaf] = {}
        self._active: set[int] = set()  # containers on the current path

    def encode(self, node: Any, path: KeyPath) -> dict:
        if isinstance(node, (dict, list, tuple)):
            return self._encode_container(node, path)
        kind = _array_kind(node)
        if kind is not None:
            return {"array": self._add_leaf(node, kind, path)}
        if node is None or isinstance(node, (bool, int, float, str)):
            return {"value": node}
        raise CheckpointError(
            f"Cannot save the value at key {_dotted(path)!r}: type "
            f"{type(node).__module__}.{type(node).__qualname__} is not supported. "
            "Leaves may be jax/numpy arrays, numpy scalars, torch tensors, int, "
            "float, bool, str or None; convert the value or leave it out."
        )

    def _encode_container(self, node: dict | list | tuple, path: KeyPath) -> dict:
        if id(node) in self._active:
            raise CheckpointError(
                f"Cannot save: the container at key {_dotted(path)!r} contains itself."
            )
        self._active.add(id(node))
        try:
            if isinstance(node, dict):
                items = [(_check_key(k, path), v) for k, v in node.items()]
                return {"dict": [[k, self.encode(v, (*path, k))] for k, v in items]}
            children = [self.encode(v, (*path, i)) for i, v in enumerate(node)]
            return {"list" if isinstance(node, list) else "tuple": children}
        finally:
            self._active.discard(id(node))

    def _add_leaf(self, node: Any, kind: str, path: KeyPath) -> str:
        dtype = _dtype_name(node, kind)
        if dtype not in _SUPPORTED_DTYPES:
            raise CheckpointError(
                f"Cannot save the array at key {_dotted(path)!r}: dtype {dtype} is "
                f"not supported. Supported: {', '.join(sorted(_SUPPORTED_DTYPES))}."
            )
        name = ".".join(_escape(key) for key in path)
        if name in self.leaves:
            raise CheckpointError(
                f"Cannot save: the keys {_brackets(self.leaves[name].path)} and "
                f"{_brackets(path)} both map to the dataset name {name!r}. Rename "
                "one of them."
            )
        self.leaves[name] = _Leaf(name, path, node, kind)
        return name


def _check_key(key: Any, path: KeyPath) -> str | int:
    if type(key) is str or type(key) is int:
        return key
    raise CheckpointError(
        f"Cannot save the dict at key {_dotted(path)!r}: its key {key!r} has type "
        f"{type(key).__qualname__}; checkpoint dict keys must be str or int."
    )


def _array_kind(node: Any) -> str | None:
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    if torch is not None and isinstance(node, torch.Tensor):
        return "torch"
    if isinstance(node, jax.Array):
        return "jax"
    if isinstance(node, np.ndarray):
        return "numpy"
    if isinstance(node, np.generic):
        return "numpy_scalar"
    return None


def _dtype_name(node: Any, kind: str) -> str:
    if kind == "torch":
        return str(node.dtype).removeprefix("torch.")
    return np.dtype(node.dtype).name


def _escape(key: str | int) -> str:
    text = str(key).replace("%", "%25").replace("/", "%2F")
    return text or "%"


def _dotted(path: KeyPath) -> str:
    return ".".join(str(key) for key in path)


def _brackets(path: KeyPath) -> str:
    return "".join(f"[{key!r}]" for key in path)


# ----------------------------------------------------------------------------- load


def load(path: PathLike, map_location: str | None = None) -> Any:
    """Reads a checkpoint written by :func:`save`. Never unpickles anything.

    Containers come back as ``dict``/``list``/``tuple`` with the saved keys (int
    keys stay int) and order; non-array leaves come back as the saved Python
    values. Every array is read now (a later version reads them on access).

    Args:
      path: The checkpoint file.
      map_location: ``None`` or ``"cpu"``: arrays are numpy arrays (bfloat16 as
        ``ml_dtypes.bfloat16``) and saved numpy scalars are numpy scalars.
        ``"jax"``: arrays are jax arrays with the saved dtype; a 64-bit array is
        refused unless ``jax_enable_x64`` is on, rather than silently narrowed.

    Returns:
      The saved tree.

    Raises:
      CheckpointError: A missing file, a file that is not a cerebrax checkpoint,
        a partially written or damaged one, one from a newer format version, or
        an unsupported ``map_location``.
    """
    path = os.fspath(path)
    to_target = _target_converter(map_location)
    with _open_checkpoint(path) as file:
        structure = _read_structure(file, path)

        def read_leaf(name: str) -> Any:
            return to_target(name, _read_array(_dataset(file, name, path)))

        return _decode(structure, read_leaf, path)


def is_checkpoint(path: PathLike) -> bool:
    """Whether ``path`` is a complete cerebrax checkpoint this version can read.

    Only the root attributes are read, never array data.
    """
    try:
        with _open_checkpoint(os.fspath(path)):
            return True
    except CheckpointError:
        return False


def _open_checkpoint(path: str) -> h5py.File:
    """Opens ``path`` and checks its format attributes; the caller closes it."""
    try:
        file = h5py.File(path, "r")
    except FileNotFoundError as error:
        raise CheckpointError(f"No checkpoint at {path!r}: no such file.") from error
    except (PermissionError, IsADirectoryError) as error:
        raise CheckpointError(f"Cannot read checkpoint {path!r}: {error}") from error
    except OSError as error:
        raise CheckpointError(
            f"{path!r} is not a cerebrax H5 checkpoint: it is not an HDF5 file."
        ) from error
    try:
        _check_header(file.attrs, path)
    except BaseException:
        file.close()
        raise
    return file


def _check_header(attrs: h5py.AttributeManager, path: str) -> None:
    if _VERSION_ATTR not in attrs:
        raise CheckpointError(
            f"{path!r} is not a cerebrax H5 checkpoint: the HDF5 file has no "
            f"{_VERSION_ATTR!r} attribute. Only files written by cerebrax.ckpt.save "
            "can be loaded."
        )
    found = str(attrs[_VERSION_ATTR])
    if _parse_version(found, path) > _parse_version(FORMAT_VERSION, path):
        writer = attrs.get(_CEREBRAX_VERSION_ATTR, "unknown")
        raise CheckpointError(
            f"Checkpoint {path!r} uses format version {found} (written by cerebrax "
            f"{writer}), newer than format version {FORMAT_VERSION} that this "
            "cerebrax reads. Upgrade cerebrax to load it."
        )
    if not attrs.get(_SUCCESS_ATTR, False):
        raise CheckpointError(
            f"Cannot load partially written checkpoint at {path!r}: the "
            f"{_SUCCESS_ATTR!r} marker is missing, so the save that wrote it did not "
            "finish. Load an earlier checkpoint or save again."
        )
    if _STRUCTURE_ATTR not in attrs:
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: its {_STRUCTURE_ATTR!r} attribute is "
            "missing."
        )


def _parse_version(text: str, path: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        raise CheckpointError(
            f"Checkpoint {path!r} has an unreadable format version {text!r}."
        ) from None


def _read_structure(file: h5py.File, path: str) -> dict:
    try:
        return json.loads(file.attrs[_STRUCTURE_ATTR])
    except (TypeError, ValueError) as error:
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: {_STRUCTURE_ATTR!r} is not valid JSON "
            f"({error})."
        ) from error


def _dataset(file: h5py.File, name: str, path: str) -> h5py.Dataset:
    node = file.get(name)
    if not isinstance(node, h5py.Dataset):
        raise CheckpointError(
            f"Checkpoint {path!r} is damaged: the dataset {name!r} named in its "
            "structure is missing."
        )
    return node


def _read_array(dataset: h5py.Dataset) -> np.ndarray | np.generic:
    """Reads one dataset as the numpy array (or numpy scalar) that was saved."""
    array = np.asarray(dataset[...])  # reads the data from disk
    dtype = str(dataset.attrs.get(_DTYPE_ATTR, array.dtype.name))
    if dtype == "bfloat16":
        array = array.view(ml_dtypes.bfloat16)
    if array.dtype.name != dtype:
        raise CheckpointError(
            f"Dataset {dataset.name!r} in {dataset.file.filename!r} is damaged: it "
            f"holds {array.dtype.name} data but records dtype {dtype}."
        )
    if dataset.attrs.get(_KIND_ATTR) == "numpy_scalar":
        return array[()]
    return array


def _target_converter(
    map_location: str | None,
) -> Callable[[str, np.ndarray | np.generic], Any]:
    if map_location is None or map_location == "cpu":
        return lambda name, array: array
    if map_location == "jax":
        return _to_jax
    raise CheckpointError(
        f"load: map_location={map_location!r} is not supported; use {_MAP_LOCATIONS}."
    )


def _to_jax(name: str, array: np.ndarray | np.generic) -> jax.Array:
    if jax.dtypes.canonicalize_dtype(array.dtype) != array.dtype:
        raise CheckpointError(
            f"Cannot load {name!r} as a jax array: its dtype {array.dtype.name} needs "
            "jax_enable_x64 (jax would narrow it). Enable it with "
            "jax.config.update('jax_enable_x64', True), or load with "
            "map_location='cpu' and convert yourself."
        )
    return jnp.asarray(array)  # host -> device copy


def _decode(node: Any, read_leaf: Callable[[str], Any], path: str) -> Any:
    try:
        ((tag, payload),) = node.items()
    except (AttributeError, ValueError):
        tag, payload = None, None
    if tag == "array":
        return read_leaf(payload)
    if tag == "value":
        return payload
    if tag == "dict":
        return {key: _decode(child, read_leaf, path) for key, child in payload}
    if tag in ("list", "tuple"):
        items = [_decode(child, read_leaf, path) for child in payload]
        return items if tag == "list" else tuple(items)
    raise CheckpointError(
        f"Checkpoint {path!r} is damaged: unknown structure node {node!r}."
    )
