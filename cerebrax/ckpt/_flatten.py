"""Splitting a state dict into the JSON structure and the array leaves to write."""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from cerebrax.errors import CheckpointError

from ._format import SUPPORTED_DTYPES, KeyPath, brackets, describe, dotted, escape
from ._lazy import array_kind


class Leaf(NamedTuple):
    """An array leaf waiting to be written."""

    name: str  # dataset name
    path: KeyPath  # where the leaf sits in the tree
    value: Any  # jax.Array, np.ndarray, np.generic or torch.Tensor
    kind: str  # "jax" | "numpy" | "numpy_scalar" | "torch"
    node: dict  # its structure node; the writer adds the digest


def flatten(tree: Any) -> tuple[dict, list[Leaf]]:
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
        self.leaves: dict[str, Leaf] = {}
        self._active: set[int] = set()  # containers on the current path

    def encode(self, node: Any, path: KeyPath) -> dict:
        if isinstance(node, (dict, list, tuple)):
            return self._encode_container(node, path)
        kind = array_kind(node)
        if kind is not None:
            return self._add_leaf(node, kind, path)
        if node is None or isinstance(node, (bool, int, float, str)):
            return {"value": node}
        raise CheckpointError(
            f"Cannot save the value at key {dotted(path)!r}: type {describe(node)} is "
            "not supported. Leaves may be jax/numpy arrays, numpy scalars, torch "
            "tensors, int, float, bool, str or None; convert the value or leave it out."
        )

    def _encode_container(self, node: dict | list | tuple, path: KeyPath) -> dict:
        if id(node) in self._active:
            raise CheckpointError(
                f"Cannot save: the container at key {dotted(path)!r} contains itself."
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

    def _add_leaf(self, value: Any, kind: str, path: KeyPath) -> dict:
        dtype = _dtype_name(value, kind)
        if dtype not in SUPPORTED_DTYPES:
            raise CheckpointError(
                f"Cannot save the array at key {dotted(path)!r}: dtype {dtype} is "
                f"not supported. Supported: {', '.join(sorted(SUPPORTED_DTYPES))}."
            )
        name = ".".join(escape(key) for key in path)
        if name in self.leaves:
            raise CheckpointError(
                f"Cannot save: the keys {brackets(self.leaves[name].path)} and "
                f"{brackets(path)} both map to the dataset name {name!r}. Rename "
                "one of them."
            )
        shape = [int(n) for n in getattr(value, "shape", ())]
        node = {"array": name, "dtype": dtype, "shape": shape, "kind": kind}
        self.leaves[name] = Leaf(name, path, value, kind, node)
        return node


def _check_key(key: Any, path: KeyPath) -> str | int:
    if type(key) is str or type(key) is int:
        return key
    raise CheckpointError(
        f"Cannot save the dict at key {dotted(path)!r}: its key {key!r} has type "
        f"{type(key).__qualname__}; checkpoint dict keys must be str or int."
    )


def _dtype_name(node: Any, kind: str) -> str:
    if kind == "torch":
        return str(node.dtype).removeprefix("torch.")
    return np.dtype(node.dtype).name


def to_host(leaf: Leaf) -> np.ndarray:
    """The leaf as a C-contiguous, native-order numpy array (bf16 as ml_dtypes)."""
    try:
        if leaf.kind == "torch":
            array = torch_to_numpy(leaf.value)
        else:
            array = np.asarray(leaf.value)  # device -> host copy; reads a LazyArray
    except (TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(
            f"Cannot save the value at key {dotted(leaf.path)!r}: converting it to "
            f"a host array failed ({error}). Save concrete arrays, not traced values."
        ) from error
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array if array.flags.c_contiguous else array.copy(order="C")  # keeps 0-d


def torch_to_numpy(tensor: Any) -> np.ndarray:
    torch = sys.modules["torch"]
    if tensor.layout != torch.strided:
        raise TypeError(f"only dense tensors can be saved, not {tensor.layout}")
    tensor = tensor.detach().cpu().resolve_conj().resolve_neg()
    if tensor.dtype == torch.bfloat16:  # numpy has no bf16: go through the bits
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()
