"""``cstorch.utils.nest``: walking nested structures of tensors.

``visit_torch_tensors`` yields every torch tensor of a nested batch with the keys that
lead to it; ``recurse_spec`` gives, for a ``torch.utils._pytree`` spec, the key path of
every leaf in flattening order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .._filters import is_torch_tensor

__all__ = ["recurse_spec", "visit_structure", "visit_torch_tensors"]


def visit_structure(data: Any, select_fn: Any, strict: bool = False,
                    scope: list | None = None) -> Iterator[tuple[list, Any]]:
    """Yields ``(scope, value)`` for every value of nested dicts, lists and tuples for
    which ``select_fn(value)`` is true; ``scope`` is the list of keys (dict keys, list
    indices) from the top, after the given ``scope``. ``strict``: any other leaf is a
    ``TypeError``."""
    scope = list(scope or [])
    if isinstance(data, Mapping):
        for key, value in data.items():
            yield from visit_structure(value, select_fn, strict, [*scope, key])
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            yield from visit_structure(value, select_fn, strict, [*scope, i])
    elif select_fn(data):
        yield scope, data
    elif strict:
        raise TypeError(f"Unexpected {type(data).__name__} at {'.'.join(map(str, scope))!r}.")


def visit_torch_tensors(data: Any, scope: list | None = None) -> Iterator[tuple[list, Any]]:
    """Yields ``(scope, tensor)`` for every torch tensor in ``data``.

    Example:
      >>> import torch
      >>> from cerebrax.utils.nest import visit_torch_tensors
      >>> batch = {"x": torch.zeros(2), "y": [torch.ones(1), 3]}
      >>> [(s, t.shape) for s, t in visit_torch_tensors(batch, scope=["input"])]
      [(['input', 'x'], torch.Size([2])), (['input', 'y', 0], torch.Size([1]))]
    """
    yield from visit_structure(data, is_torch_tensor, False, scope)


def recurse_spec(spec: Any, scope: list | None = None) -> Iterator[list[str]]:
    """Yields the key path (a list of strings) of every leaf of a
    ``torch.utils._pytree.TreeSpec``, in the order ``tree_flatten`` gives the leaves.

    Example:
      >>> import torch.utils._pytree as pytree
      >>> from cerebrax.utils.nest import recurse_spec
      >>> _, spec = pytree.tree_flatten({"model": {"w": 1, "b": 2}, "steps": [3, 4]})
      >>> [".".join(s) for s in recurse_spec(spec)]
      ['model.w', 'model.b', 'steps.0', 'steps.1']
    """
    scope = list(scope or [])
    if spec.is_leaf():
        yield scope
        return
    # torch >= 2.10 has children(); children_specs (older) is deprecated there
    children = spec.children() if hasattr(spec, "child") else spec.children_specs
    if spec.type is dict or (isinstance(spec.type, type) and issubclass(spec.type, Mapping)):
        keys = [str(k) for k in spec.context]
    elif hasattr(spec.type, "_fields") and spec.context is not None:  # namedtuple
        keys = [str(k) for k in getattr(spec.context, "_fields", range(len(children)))]
    else:
        keys = [str(i) for i in range(len(children))]
    for key, child in zip(keys, children):
        yield from recurse_spec(child, [*scope, key])
