"""A pytree split into its arrays and the rest, and put back: :func:`partition`, :func:`combine`.

Trees cross a program's boundary all over cerebrax: a traced step's inputs and outputs,
the arguments of its step closures and of the calls it defers past the backward pass, a
compiled model's eager call, the rows a streamed model splits. The arrays travel (as a
program's inputs, outputs or auxiliary values); everything else stays in Python and is
put back around them. :func:`partition` gives the arrays, in leaf order, and a
:class:`Skeleton`: the tree's structure, its other leaves in place, :data:`ARRAY` where
an array goes, and the torch dtype of each array that was a torch tensor.
:func:`combine` puts arrays back into a skeleton.

A torch tensor is a leaf, never a pytree. One that leaves a step as its JAX array is a
:class:`TorchLeaf` until it reaches its reader: the array and the tensor's torch dtype,
so that it can come back as a torch tensor of that dtype.

Example:
  >>> from cerebrax._tree import combine, partition
  >>> arrays, skeleton = partition({"x": jnp.ones(2), "n": 3})
  >>> skeleton.leaves
  (3, ARRAY)
  >>> combine([jnp.zeros(2)], skeleton)
  {'n': 3, 'x': Array([0., 0.], dtype=float32)}
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable
from typing import Any

import jax

from ._filters import is_torch_tensor

__all__ = ["ARRAY", "Skeleton", "TorchLeaf", "combine", "jax_array", "partition",
           "partition_leaves", "step_array"]


class _ArraySlot:
    """The placeholder of an array in a :class:`Skeleton` (one object: :data:`ARRAY`)."""

    def __repr__(self) -> str:
        return "ARRAY"

    def __reduce__(self) -> str:
        return "ARRAY"


ARRAY = _ArraySlot()


@dataclasses.dataclass(frozen=True)
class TorchLeaf:
    """A torch tensor's value outside the step that made it: its array and torch dtype."""

    array: Any
    dtype: Any


@dataclasses.dataclass(frozen=True)
class Skeleton:
    """What :func:`partition` keeps of a tree besides its arrays.

    Attributes:
      treedef: the tree's structure (JAX's ``PyTreeDef`` or torch's ``TreeSpec``).
      leaves: every leaf in order, :data:`ARRAY` where an array goes.
      torch_dtypes: one per array: the torch dtype of one that was a torch tensor, or None.
    """

    treedef: Any
    leaves: tuple
    torch_dtypes: tuple

    @property
    def statics(self) -> tuple:
        """The leaves that are not arrays, in order."""
        return tuple(x for x in self.leaves if x is not ARRAY)


def jax_array(leaf: Any) -> tuple[Any, None] | None:
    """An ``array_of`` for :func:`partition` that sends JAX arrays only (tracers
    included); a torch tensor stays where it is."""
    return (leaf, None) if isinstance(leaf, jax.Array) else None


def step_array(leaf: Any) -> tuple[Any, Any] | None:
    """The default of :func:`partition`'s ``array_of``: a JAX array (no torch dtype), a
    :class:`TorchLeaf`, or a step's torch tensor (its JAX value and its torch dtype)."""
    if isinstance(leaf, jax.Array):
        return leaf, None
    if isinstance(leaf, TorchLeaf):
        return leaf.array, leaf.dtype
    if is_torch_tensor(leaf) and hasattr(leaf, "__jax_array__"):
        return leaf.__jax_array__(), leaf.dtype
    return None


def _is_leaf(x: Any) -> bool:
    return isinstance(x, TorchLeaf) or ("torch" in sys.modules and is_torch_tensor(x))


def partition(tree: Any, array_of: Callable[[Any], tuple[Any, Any] | None] = step_array,
              *, is_leaf: Callable[[Any], bool] | None = None,
              flatten: Callable[..., tuple[list, Any]] = jax.tree.flatten,
              ) -> tuple[list, Skeleton]:
    """The arrays of ``tree`` in leaf order, and the :class:`Skeleton` that rebuilds it.

    Args:
      tree: any pytree; torch tensors and :class:`TorchLeaf` values are leaves.
      array_of: for a leaf, ``(array, torch_dtype)`` where it travels as an array, None
        where it stays (:func:`step_array` by default).
      is_leaf: more values to treat as leaves (as ``jax.tree.flatten``'s).
      flatten: the pytree library's flatten: JAX's, or torch's
        (``torch.utils._pytree.tree_flatten``) for trees of torch's containers.
    """
    leaves, treedef = flatten(
        tree, is_leaf=_is_leaf if is_leaf is None else lambda x: _is_leaf(x) or is_leaf(x))
    return partition_leaves(leaves, treedef, array_of)


def partition_leaves(leaves: Iterable[Any], treedef: Any,
                     array_of: Callable[[Any], tuple[Any, Any] | None] = step_array,
                     ) -> tuple[list, Skeleton]:
    """:func:`partition` of a tree already flattened into ``leaves`` and ``treedef``."""
    arrays, kept, torch_dtypes = [], [], []
    for leaf in leaves:
        found = array_of(leaf)
        if found is None:
            kept.append(leaf)
        else:
            arrays.append(found[0])
            torch_dtypes.append(found[1])
            kept.append(ARRAY)
    return arrays, Skeleton(treedef, tuple(kept), tuple(torch_dtypes))


def combine(arrays: Iterable[Any], skeleton: Skeleton, *,
            torch: Callable[[Any, Any], Any] | None = None) -> Any:
    """The tree of ``skeleton`` with ``arrays`` in its :data:`ARRAY` places.

    Args:
      arrays: one per place, in order.
      skeleton: from :func:`partition`.
      torch: where given, ``torch(array, dtype)`` is put in the place of each array that
        was a torch tensor (e.g. :class:`TorchLeaf`, or a conversion to a tensor).
    """
    arrays = iter(arrays)
    dtypes = iter(skeleton.torch_dtypes)

    def place() -> Any:
        array, dtype = next(arrays), next(dtypes)
        return array if torch is None or dtype is None else torch(array, dtype)

    return skeleton.treedef.unflatten([place() if x is ARRAY else x for x in skeleton.leaves])
