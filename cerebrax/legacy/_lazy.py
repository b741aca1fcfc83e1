"""Lazy values and the recipe of one Session step.

Inside a :class:`~cerebrax.legacy.Session`, the loop body's calls (the model, the
criterion, arithmetic on their results, ``loss.backward()``, ``optimizer.zero_grad()``
and ``optimizer.step()``) do not compute anything. Each is appended to a
:class:`Recipe` as a :class:`Node`, and a call that produces a value returns a
:class:`LazyTensor` standing for it. When the step ends, the Session replays the
recipe inside one ``@cstorch.trace`` step; the step's outputs resolve the lazy values.

A node's arguments are encoded leaf by leaf: a lazy value of the same recipe is a
:class:`Ref` to its node, an array (numpy, JAX, torch, or a resolved lazy value) is a
step input named after the call that took it, and anything else (a Python number, a
string, ``None``) is a static part of the graph, as in a traced step.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from .._filters import is_array
from .._step import backward
from ..errors import StateError

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["LazyTensor", "Node", "Recipe", "Ref"]

# Kinds of nodes: "call" (model or criterion), "op" (arithmetic on lazy values),
# and the actions "backward", "zero_grad", "step".
VALUE_KINDS = ("call", "op")


@dataclasses.dataclass(frozen=True)
class Ref:
    """An argument that is the value of an earlier node of the same recipe."""

    index: int


@dataclasses.dataclass(frozen=True)
class Input:
    """An argument that is an array: one input of the compiled step."""

    name: str


@dataclasses.dataclass(eq=False)
class Node:
    """One recorded call of the loop body.

    Attributes:
      kind: ``"call"``, ``"op"``, ``"backward"``, ``"zero_grad"`` or ``"step"``.
      target: what runs in the program: the compiled model, the converted criterion,
        an arithmetic function, or the optimizer whose ``kind`` method is called.
      label: a readable name for messages (``"model"``, ``"criterion"``, ``"mean"``).
      treedef: the structure of ``(args, kwargs)``.
      leaves: the encoded leaves: :class:`Ref`, :class:`Input` or static values.
    """

    kind: str
    target: Any
    label: str
    treedef: Any
    leaves: list
    value: Any = None
    resolved: bool = False

    def describe(self) -> str:
        if self.kind == "backward":
            return "loss.backward()"
        if self.kind in ("zero_grad", "step"):
            return f"optimizer.{self.kind}()"
        return f"{self.label}(...)"

    def run(self, values: list, inputs: dict) -> Any:
        """Runs the node inside the traced step; ``values`` holds earlier nodes' results."""
        leaves = [
            values[x.index] if isinstance(x, Ref) else inputs[x.name] if isinstance(x, Input)
            else x
            for x in self.leaves
        ]
        args, kwargs = jax.tree.unflatten(self.treedef, leaves)
        if self.kind in VALUE_KINDS:
            return self.target(*args, **kwargs)
        if self.kind == "backward":
            backward(*args, **kwargs)
        else:  # the optimizer's own method, not the Session's stand-in on the instance
            getattr(type(self.target), self.kind)(self.target, *args, **kwargs)
        return None


def _same_static(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # objects whose == is not a plain bool
        return a is b


def _leaf_kind(leaf: Any) -> Any:
    return leaf if isinstance(leaf, (Ref, Input)) else ("static", leaf)


class Recipe:
    """The calls of one step, in order, and the arrays they took (this step's inputs)."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.inputs: dict[str, Any] = {}

    def add(self, kind: str, target: Any, label: str, args: tuple, kwargs: dict) -> Node:
        index = len(self.nodes)
        pairs, treedef = jax.tree_util.tree_flatten_with_path(
            (args, kwargs),
            is_leaf=lambda x: isinstance(x, LazyTensor) or is_array(x, torch=True)
        )
        leaves = []
        for path, leaf in pairs:
            if isinstance(leaf, LazyTensor):
                if leaf._node.resolved:
                    leaf = leaf._node.value
                elif leaf._recipe is self:
                    leaves.append(Ref(leaf._index))
                    continue
                else:
                    raise StateError(
                        f"{label}(...) got a lazy value of an earlier Session step that "
                        "never ran. Use values after the step that computes them."
                    )
            if is_array(leaf, torch=True):
                name = f"{index}.{label}{jax.tree_util.keystr(path[1:])}"
                self.inputs[name] = leaf
                leaves.append(Input(name))
            else:
                leaves.append(leaf)
        node = Node(kind, target, label, treedef, leaves)
        self.nodes.append(node)
        return node

    def skeleton(self) -> Recipe:
        """The graph of this recipe without this step's inputs and values (kept by the
        Session to compare later steps with, and to trace from)."""
        copy = Recipe()
        copy.nodes = [dataclasses.replace(n, value=None, resolved=False) for n in self.nodes]
        return copy

    def difference(self, other: Recipe) -> str | None:
        """How ``other`` (a later step) differs from this recipe in graph terms, or None."""
        for i, (a, b) in enumerate(zip(self.nodes, other.nodes)):
            if (a.kind, a.label) != (b.kind, b.label) or a.target is not b.target:
                return (f"call {i} of the step was {a.describe()} when the step was "
                        f"compiled, but is {b.describe()} now")
            kinds_a = [_leaf_kind(x) for x in a.leaves]
            kinds_b = [_leaf_kind(x) for x in b.leaves]
            if a.treedef != b.treedef or len(kinds_a) != len(kinds_b) or not all(
                x == y if not (isinstance(x, tuple) and isinstance(y, tuple))
                else _same_static(x[1], y[1])
                for x, y in zip(kinds_a, kinds_b)
            ):
                return (f"the arguments of call {i}, {a.describe()}, differ from those it "
                        "had when the step was compiled (their structure, which earlier "
                        "values they use, or a Python value that is part of the graph)")
        if len(self.nodes) != len(other.nodes):
            calls = ", ".join(n.describe() for n in other.nodes[len(self.nodes):]) or (
                ", ".join(n.describe() for n in self.nodes[len(other.nodes):]))
            return (f"the step was compiled with {len(self.nodes)} calls, but this one "
                    f"makes {len(other.nodes)} (the difference: {calls})")
        return None

    def replay(self, inputs: dict) -> list:
        """Runs every node in order (inside the traced step); the value of each node."""
        values: list = []
        for node in self.nodes:
            values.append(node.run(values, inputs))
        return values


def _binary(fn: Callable[[Any, Any], Any], name: str, reflected: bool = False):
    def method(self: LazyTensor, other: Any) -> Any:
        args = (other, self) if reflected else (self, other)
        return self._apply(fn, name, args)

    method.__name__ = f"__{'r' if reflected else ''}{name}__"
    return method


def _mean(x: Any, dim: Any = None, keepdim: bool = False) -> jax.Array:
    return jnp.mean(x, axis=dim, keepdims=keepdim)


def _sum(x: Any, dim: Any = None, keepdim: bool = False) -> jax.Array:
    return jnp.sum(x, axis=dim, keepdims=keepdim)


def _argmax(x: Any, dim: Any = None, keepdim: bool = False) -> jax.Array:
    return jnp.argmax(x, axis=dim, keepdims=keepdim)


def _to_float(x: Any) -> jax.Array:
    return jnp.asarray(x, jnp.float32)


def _identity(x: Any) -> Any:
    return x


class LazyTensor:
    """The value of a call in a Session's loop body, computed when the step runs.

    Before the step it can be passed to the model or the criterion, combined with
    arithmetic (``+ - * / **``, comparisons, ``mean``, ``sum``, ``argmax``,
    indexing) and marked with ``backward()``. After the step ``item()``, ``numpy()``,
    ``float(x)`` and friends return the materialized value, and arithmetic computes
    right away. Reading a value before its step ran raises
    :class:`cerebrax.TensorReadError` in train mode and runs the step in eval mode.
    """

    __slots__ = ("_session", "_recipe", "_index", "_node")

    def __init__(self, session: Session, recipe: Recipe, index: int):
        self._session = session
        self._recipe = recipe
        self._index = index
        self._node = recipe.nodes[index]

    # ---- the graph -------------------------------------------------------------------
    def _apply(self, fn: Callable[..., Any], name: str, args: tuple, kwargs: dict | None = None):
        kwargs = kwargs or {}
        lazy = [x for x in jax.tree.leaves((args, kwargs),
                                           is_leaf=lambda x: isinstance(x, LazyTensor))
                if isinstance(x, LazyTensor)]
        if all(x._node.resolved for x in lazy):  # after the step: compute right away
            args, kwargs = jax.tree.map(
                lambda x: x._node.value if isinstance(x, LazyTensor) else x, (args, kwargs),
                is_leaf=lambda x: isinstance(x, LazyTensor))
            return fn(*args, **kwargs)
        return self._session._record_value("op", fn, name, args, kwargs)

    def backward(self) -> None:
        """Marks this value as the loss: the step differentiates it (``cstorch.backward``)."""
        self._session._record_backward(self)

    def mean(self, dim: Any = None, keepdim: bool = False) -> Any:
        """The mean over ``dim`` (all elements by default), recorded or computed."""
        return self._apply(_mean, "mean", (self,), {"dim": dim, "keepdim": keepdim})

    def sum(self, dim: Any = None, keepdim: bool = False) -> Any:
        """The sum over ``dim`` (all elements by default), recorded or computed."""
        return self._apply(_sum, "sum", (self,), {"dim": dim, "keepdim": keepdim})

    def argmax(self, dim: Any = None, keepdim: bool = False) -> Any:
        """The index of the largest element along ``dim`` (of the flattened value by
        default), recorded or computed."""
        return self._apply(_argmax, "argmax", (self,), {"dim": dim, "keepdim": keepdim})

    def float(self) -> Any:
        """The value as float32, recorded or computed."""
        return self._apply(_to_float, "float", (self,))

    def detach(self) -> Any:
        """The same value (a step's outputs carry no gradient)."""
        return self

    def cpu(self) -> Any:
        """The same value (values are read on the host anyway)."""
        return self

    def __getitem__(self, index: Any) -> Any:
        return self._apply(operator.getitem, "getitem", (self, index))

    __add__ = _binary(operator.add, "add")
    __radd__ = _binary(operator.add, "add", reflected=True)
    __sub__ = _binary(operator.sub, "sub")
    __rsub__ = _binary(operator.sub, "sub", reflected=True)
    __mul__ = _binary(operator.mul, "mul")
    __rmul__ = _binary(operator.mul, "mul", reflected=True)
    __truediv__ = _binary(operator.truediv, "truediv")
    __rtruediv__ = _binary(operator.truediv, "truediv", reflected=True)
    __pow__ = _binary(operator.pow, "pow")
    __eq__ = _binary(operator.eq, "eq")  # type: ignore[assignment]
    __ne__ = _binary(operator.ne, "ne")  # type: ignore[assignment]
    __lt__ = _binary(operator.lt, "lt")
    __le__ = _binary(operator.le, "le")
    __gt__ = _binary(operator.gt, "gt")
    __ge__ = _binary(operator.ge, "ge")
    __hash__ = object.__hash__

    def __neg__(self) -> Any:
        return self._apply(operator.neg, "neg", (self,))

    def __pos__(self) -> Any:
        return self._apply(_identity, "pos", (self,))

    # ---- reading ---------------------------------------------------------------------
    @property
    def value(self) -> Any:
        """The materialized value (a JAX array or pytree); runs the step in eval mode."""
        if not self._node.resolved:
            self._session._materialize(self)
        return self._node.value

    def item(self) -> Any:
        """The value of a one-element tensor as a Python number; waits for its step."""
        return np.asarray(self.value).item()

    def numpy(self) -> np.ndarray:
        """The value as a numpy array; waits for its step."""
        return np.asarray(self.value)

    def tolist(self) -> Any:
        """The value as (nested) Python lists; waits for its step."""
        return np.asarray(self.value).tolist()

    @property
    def shape(self) -> tuple[int, ...]:
        """The value's shape; waits for its step."""
        return tuple(np.shape(self.value))

    @property
    def dtype(self) -> Any:
        """The value's dtype; waits for its step."""
        return self.value.dtype

    def size(self, dim: int | None = None) -> Any:
        """The shape, or its size along ``dim``, as torch's ``Tensor.size``."""
        return self.shape if dim is None else self.shape[dim]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = np.asarray(self.value, dtype=dtype)
        return out.copy() if copy else out

    def __jax_array__(self) -> jax.Array:
        return jnp.asarray(self.value)

    def __float__(self) -> float:
        return float(np.asarray(self.value))

    def __int__(self) -> int:
        return int(np.asarray(self.value))

    def __bool__(self) -> bool:
        return bool(np.asarray(self.value))

    def __len__(self) -> int:
        return len(self.value)

    def __iter__(self):
        return iter(self.value)

    def __format__(self, spec: str) -> str:
        return format(np.asarray(self.value).item() if np.ndim(self.value) == 0
                      else np.asarray(self.value), spec)

    def __repr__(self) -> str:
        if self._node.resolved:
            return f"LazyTensor({self._node.value!r})"
        return f"LazyTensor({self._node.describe()}, pending)"
