"""Runs one exported ATen graph on JAX arrays, node by node, through the op registry.

The walk happens once per trace: under ``jax.jit`` the Python loop disappears and only
the JAX operations the lowerings emit remain.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.node import map_arg

from cerebrax.errors import UnsupportedOpError

from . import ops
from .ops._dtypes import jax_dtype, to_jax
from .ops._scalar_ops import zero_dim_as_half
from .ops._util import broadcast_accumulating
from ._side_calls import SideCalls

__all__ = ["Program", "ProgramStage", "layer_path"]

# Python functions that may appear in an exported graph (shape arithmetic, tuple access).
_PYTHON_OPS = {
    operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv,
    operator.truediv, operator.mod, operator.neg, operator.pow, operator.eq, operator.ne,
    operator.lt, operator.le, operator.gt, operator.ge, math.ceil, math.floor, math.sqrt,
    max, min, abs,
}

MSG_UNSUPPORTED = """\
torch_bridge has no JAX lowering for {ops}.
{uses}
Register a lowering before converting the module. It receives the op's arguments with
every tensor as a JAX array (the others as torch passes them) and returns what the op
returns:

    import torch
    from torch_bridge import lowering

    @lowering(torch.ops.{first})
    def my_lowering(*args, **kwargs):
        ...  # JAX code; return a jax.Array, or a tuple if the op returns several

Pass random=True to lowering() if the op is random: the function then receives a
jax.random key as its first argument."""


def module_path(node: torch.fx.Node) -> str:
    """The path of the innermost module that produced ``node`` (``"blocks.0.fc1"``)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "<the module's own forward>"
    path, cls = list(stack.values())[-1]
    cls_name = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
    return f"{path or '<root module>'!r} ({cls_name})"


def _unsupported_error(nodes: list[torch.fx.Node]) -> UnsupportedOpError:
    ops = list(dict.fromkeys(str(n.target) for n in nodes))
    uses = "\n".join(f"  - {n.target} in module {module_path(n)}" for n in nodes)
    return UnsupportedOpError(
        MSG_UNSUPPORTED.format(ops=", ".join(ops), uses="Used by:\n" + uses, first=ops[0])
    )


def _is_supported(target: Any) -> bool:
    return ops.lookup(target) is not None or target in _PYTHON_OPS


class Program:
    """One exported graph (one mode, one input signature) ready to run on JAX arrays.

    Args:
      exported: the decomposed ``ExportedProgram``.
      canonical: state-dict name -> the name the value is stored under (tied weights).
      side_calls: the calls ``forward`` made for their effect (a metric update): the
        graph's last user outputs are their arguments, and :meth:`run` makes the calls.
    """

    def __init__(self, exported: torch.export.ExportedProgram, canonical: dict[str, str],
                 side_calls: SideCalls | None = None):
        graph = exported.graph_module.graph
        self.side_calls = side_calls or SideCalls()
        self.in_spec = exported.call_spec.in_spec
        self.out_spec = self.side_calls.out_spec(exported.call_spec.out_spec)
        by_name = {n.name: n for n in graph.nodes if n.op == "placeholder"}
        self._inputs: list[tuple[torch.fx.Node, str, Any]] = []
        n_user = 0
        for spec in exported.graph_signature.input_specs:
            node = by_name[spec.arg.name]
            if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                kind = "param" if spec.kind == InputKind.PARAMETER else "buffer"
                self._inputs.append((node, kind, canonical.get(spec.target, spec.target)))
            elif spec.kind == InputKind.CONSTANT_TENSOR:
                self._inputs.append((node, "const", to_jax(exported.constants[spec.target])))
            elif spec.kind == InputKind.USER_INPUT:
                self._inputs.append((node, "input", n_user))
                n_user += 1
            else:
                raise UnsupportedOpError(
                    f"torch_bridge cannot run an exported graph with a {spec.kind.name} "
                    f"input ({spec.arg.name!r}); only parameters, buffers, constant tensors "
                    "and user inputs are supported."
                )
        self.num_user_inputs = n_user
        self._outputs = [
            (spec.kind, canonical.get(spec.target, spec.target))
            for spec in exported.graph_signature.output_specs
        ]
        self.nodes = [n for n in graph.nodes if n.op == "call_function"]
        others = [n for n in graph.nodes if n.op in ("get_attr", "call_module", "call_method")]
        missing = [n for n in self.nodes if not _is_supported(n.target)] + others
        if missing:
            raise _unsupported_error(missing)
        self._output_node = next(n for n in graph.nodes if n.op == "output")
        self.random_nodes = [
            n for n in self.nodes
            if (e := ops.lookup(n.target)) is not None
            and ops.is_random(e, n.args, n.kwargs)
        ]
        self._random_index = {n: i for i, n in enumerate(self.random_nodes)}
        self._causal: dict[torch.fx.Node, bool] = {}  # see _causal_mask
        # Pointwise ops on floating values: their output shapes (see _broadcast_half);
        # add, sub, mul and div sum a broadcast half operand's gradient themselves
        # (ops/_scalar_ops.py), and need to see which operand is a 0-dim tensor.
        # Pointwise ops whose 0-dim operands follow torch's promotion (zero_dim_as_half)
        self._promoting = {
            n for n in self.nodes if torch.Tag.pointwise in getattr(n.target, "tags", ())
            and n.target not in _OWN_BROADCAST}
        self._pointwise = {
            n: tuple(n.meta["val"].shape) for n in self.nodes
            if torch.Tag.pointwise in getattr(n.target, "tags", ())
            and n.target not in _OWN_BROADCAST
            and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_floating_point()
        }
        self.ops = sorted({str(n.target) for n in self.nodes})

    @property
    def needs_key(self) -> bool:
        """Whether the graph draws random numbers (dropout, ``torch.rand``...): then
        :meth:`run` needs a JAX PRNG key."""
        return bool(self.random_nodes)

    def run(
        self, params: dict, buffers: dict, inputs: list, key: jax.Array | None
    ) -> tuple[list, dict[str, Any]]:
        """Runs the graph. Returns (flat user outputs, {buffer name: new value})."""
        env: dict[torch.fx.Node, Any] = {}
        self._bind(env, self._inputs, params, buffers, inputs)
        self._execute(self.nodes, env, key)
        results = map_arg(self._output_node.args[0], env.__getitem__)
        user, mutated = [], {}
        for (kind, target), value in zip(self._outputs, results):
            if kind == OutputKind.USER_OUTPUT:
                user.append(value)
            elif kind == OutputKind.BUFFER_MUTATION:
                mutated[target] = value
            # USER_INPUT_MUTATION: JAX arrays are immutable; the caller keeps its input.
        return self.side_calls.run(user), mutated

    def _bind(self, env: dict, specs: list, params: dict, buffers: dict, inputs: list) -> None:
        for node, kind, ref in specs:
            if kind == "param":
                env[node] = params[ref]
            elif kind == "buffer":
                env[node] = buffers[ref]
            elif kind == "const":
                env[node] = ref
            else:
                env[node] = inputs[ref]

    def _execute(self, nodes: list[torch.fx.Node], env: dict, key: jax.Array | None) -> None:
        keys = None
        if any(n in self._random_index for n in nodes):
            if key is None:
                raise _missing_key_error(self.random_nodes)
            # Every random node keeps its own split of the key, whichever nodes run.
            keys = jax.random.split(key, len(self.random_nodes))
        for node in nodes:
            args, kwargs = map_arg((node.args, node.kwargs), env.__getitem__)
            entry = ops.lookup(node.target)
            if entry is None:  # a Python function (shape arithmetic, getitem)
                env[node] = node.target(*args, **kwargs)
                continue
            if node.target in _ATTENTION and self._causal_mask(node):
                args, kwargs = _as_causal(node.target, args, kwargs)
            if node in self._promoting:
                args = zero_dim_as_half(args)
            if node in self._pointwise:  # torch's backward sums a broadcast operand in fp32
                shape = self._pointwise[node]
                args = tuple(_broadcast_half(a, shape) for a in args)
            if entry.random:  # random-capable: a key, or None where this call is not random
                i = self._random_index.get(node)
                args = (None if i is None else keys[i], *args)
            try:
                out = entry.fn(*args, **kwargs)
            except Exception as e:
                e.add_note(f"(torch_bridge: while lowering {node.target} in module "
                           f"{module_path(node)})")
                raise
            env[node] = _conform(out, node.meta.get("val"), node)

    def _causal_mask(self, node: torch.fx.Node) -> bool:
        """Whether ``node``, an attention, has a boolean mask that depends on no input,
        parameter, buffer or random draw and is the causal one: then it is the causal flag
        (the same bits on a CPU; cuDNN's fused kernel on a GPU). Hugging Face's models
        build that mask from positions alone when exported. Evaluated once per node."""
        if node in self._causal:
            return self._causal[node]
        self._causal[node] = False
        mask = _attention_mask(node)
        value = mask.meta.get("val") if isinstance(mask, torch.fx.Node) else None
        query, key = (node.args[i].meta.get("val") for i in (0, 1))
        if (not isinstance(value, torch.Tensor) or value.dtype != torch.bool
                or value.ndim < 2 or not isinstance(query, torch.Tensor)
                or not isinstance(key, torch.Tensor)
                or tuple(value.shape[-2:]) != (query.shape[-2], key.shape[-2])
                or query.shape[-2] != key.shape[-2]):
            return False
        ancestors = self._constant_ancestors(mask)
        if ancestors is None:
            return False
        env: dict[torch.fx.Node, Any] = {}
        with jax.ensure_compile_time_eval():
            self._execute(ancestors, env, None)
        found = np.asarray(env[mask])
        causal = np.tril(np.ones(found.shape[-2:], bool))
        self._causal[node] = bool(np.array_equal(found, np.broadcast_to(causal, found.shape)))
        return self._causal[node]

    def _constant_ancestors(self, node: torch.fx.Node) -> list[torch.fx.Node] | None:
        """``node`` and the nodes it is computed from, in graph order, where none of them
        is a placeholder (an input, parameter or buffer) or draws random numbers."""
        order = {n: i for i, n in enumerate(self.nodes)}
        found, stack = set(), [node]
        while stack:
            n = stack.pop()
            if n in found:
                continue
            if n not in order or n in self._random_index:
                return None
            found.add(n)
            stack.extend(n.all_input_nodes)
        return sorted(found, key=order.__getitem__)

    # ---- pipeline stages --------------------------------------------------------------
    def layers(self) -> list[tuple[str, list[torch.fx.Node]]]:
        """The graph's nodes cut into layers, in order: ``[(layer path, nodes), ...]``.

        A layer is a run of consecutive nodes under the same child module (the first
        module below the root that is not a container: ``blocks.0``, ``fc1``); nodes of
        the root module's own forward form layers named ``"<root>"``.
        """
        units: list[tuple[str, list[torch.fx.Node]]] = []
        for node in self.nodes:
            name = layer_path(node) or "<root>"
            if units and units[-1][0] == name:
                units[-1][1].append(node)
            else:
                units.append((name, [node]))
        return units

    def stage(self, units: list[list[torch.fx.Node]], lo: int, hi: int) -> ProgramStage:
        """The nodes of layers ``lo..hi-1`` as one runnable stage (see ProgramStage)."""
        return ProgramStage(self, units, lo, hi)

    def layer_signature(self, units: list[list[torch.fx.Node]], i: int) -> tuple:
        """A structural key of layer ``i``: equal keys, equal functions.

        The key describes the layer's nodes in order (op, literal arguments, result
        shape and dtype) with every tensor argument named by its role instead of its
        name: an earlier node of the layer (by position), a value of the carry it
        receives (by position in :attr:`ProgramStage.carry_in`), a parameter or buffer
        (by position in the stage's :attr:`ProgramStage.params` / ``buffers``, with
        shape and dtype), a constant (by value) or a user input (by index); then the
        carry it sends and the buffers it updates, by the same roles. Two layers with
        equal keys (``blocks.0`` and ``blocks.1`` of an ``nn.ModuleList`` of identical
        blocks) therefore compute the same function of their positional inputs, which
        lets weight streaming run them as one ``jax.lax.scan``.

        Returns ``(core, sends)``: ``core`` holds the carry's shapes and dtypes, the
        nodes and the buffer updates; ``sends`` the roles of the carry it hands on.
        """
        part = ProgramStage(self, units, i, i + 1)
        roles: dict[torch.fx.Node, tuple] = {}
        for k, node in enumerate(part.carry_in):
            roles[node] = ("carry", k, _aval(node.meta.get("val")))
        params, buffers = list(part.params), list(part.buffers)
        for node, kind, ref in part._inputs:
            if kind == "param":
                roles[node] = ("param", params.index(ref), _aval(node.meta.get("val")))
            elif kind == "buffer":
                roles[node] = ("buffer", buffers.index(ref), _aval(node.meta.get("val")))
            elif kind == "const":
                roles[node] = ("const", _aval(ref), hash(np.asarray(ref).tobytes()))
            else:
                roles[node] = ("input", ref)
        described = []
        for k, node in enumerate(part.nodes):
            args = _described((node.args, node.kwargs), roles)
            described.append((str(node.target), args, _aval(node.meta.get("val"))))
            roles[node] = ("node", k)
        sends = tuple(roles[n] for n in part.carry_out) if not part.last else ("outputs",)
        updates = tuple((buffers.index(t), roles[v]) for t, v in part._mutations)
        received = tuple(_aval(n.meta.get("val")) for n in part.carry_in)
        return (received, tuple(described), updates), sends

    def layer_projection(self, units: list[list[torch.fx.Node]], i: int, j: int
                         ) -> tuple[int, ...] | None:
        """Whether layer ``j`` is layer ``i`` sending on only part of its carry.

        The last block of an ``nn.ModuleList`` computes what the others compute but no
        longer hands on a value that only the blocks read (an attention mask). Returns
        the positions, in layer ``i``'s carry out, of what layer ``j`` sends (so running
        ``i``'s function and keeping those positions gives ``j``'s carry out), or None
        when the layers differ otherwise (see :meth:`layer_signature`).
        """
        (core_i, sends_i), (core_j, sends_j) = (self.layer_signature(units, i),
                                                self.layer_signature(units, j))
        if core_i != core_j or "outputs" in sends_i + sends_j:
            return None
        if not set(sends_j) <= set(sends_i):
            return None
        return tuple(sends_i.index(role) for role in sends_j)

    def layer_cost(self, nodes: list[torch.fx.Node]) -> int:
        """Parameter elements a layer reads (each tied copy counted) plus its node count."""
        used = {a for n in nodes for a in n.all_input_nodes}
        size = 0
        for node, kind, _ in self._inputs:
            if kind == "param" and node in used:
                size += math.prod(node.meta["val"].shape)
        return size + len(nodes)


class ProgramStage:
    """Layers ``lo..hi-1`` of a :class:`Program`, runnable on their own.

    The stage reads the graph's parameters, buffers, constants and user inputs that its
    nodes use, plus ``carry_in``: the values that earlier layers produced and this or a
    later stage (or the graph's outputs) still needs. It returns ``carry_out`` (the same
    for the next stage) or, for the last stage, the graph's flat user outputs (the
    arguments of its side calls last, for the caller to make them), and the
    buffers its nodes update.
    """

    def __init__(self, program: Program, units: list[list[torch.fx.Node]], lo: int, hi: int):
        self.program = program
        self.last = hi == len(units)
        where = {node: i for i, nodes in enumerate(units) for node in nodes}
        end = len(units)  # the graph's user outputs count as used after the last layer
        last_use: dict[torch.fx.Node, int] = {}
        for node in where:
            for user in node.users:
                if user is not program._output_node:
                    last_use[node] = max(last_use.get(node, -1), where[user])
        outputs = program._output_node.args[0]
        for (kind, _), value in zip(program._outputs, outputs):
            if kind == OutputKind.USER_OUTPUT and isinstance(value, torch.fx.Node):
                last_use[value] = end
        ordered = list(where)

        def live(cut: int) -> list[torch.fx.Node]:
            return [n for n in ordered if where[n] < cut <= last_use.get(n, -1)]

        self.carry_in = live(lo) if lo > 0 else []
        self.carry_out = [] if self.last else live(hi)
        self.nodes = [n for nodes in units[lo:hi] for n in nodes]
        used = {a for n in self.nodes for a in n.all_input_nodes}
        self._mutations = [
            (target, value) for (kind, target), value in zip(program._outputs, outputs)
            if kind == OutputKind.BUFFER_MUTATION and where.get(value, -1) in range(lo, hi)
        ]
        if self.last:
            used.update(a for a in outputs if isinstance(a, torch.fx.Node))
        self._inputs = [spec for spec in program._inputs if spec[0] in used]
        self.params = tuple(dict.fromkeys(r for _, k, r in self._inputs if k == "param"))
        self.buffers = tuple(dict.fromkeys(
            [r for _, k, r in self._inputs if k == "buffer"] + [t for t, _ in self._mutations]))

    def run(self, params: dict, buffers: dict, carry: Any, inputs: list,
            key: jax.Array | None) -> tuple[Any, dict[str, Any]]:
        """Returns ``(carry_out | flat user outputs, {buffer name: new value})``."""
        env: dict[torch.fx.Node, Any] = dict(zip(self.carry_in, carry or ()))
        self.program._bind(env, self._inputs, params, buffers, inputs)
        self.program._execute(self.nodes, env, key)
        mutated = {target: env[value] for target, value in self._mutations}
        if not self.last:
            return tuple(env[n] for n in self.carry_out), mutated
        outputs = map_arg(self.program._output_node.args[0], env.__getitem__)
        # With the side calls' arguments last: the caller makes them (SideCalls.run)
        # where the stage's outputs have been gathered.
        return [v for (kind, _), v in zip(self.program._outputs, outputs)
                if kind == OutputKind.USER_OUTPUT], mutated


_ATTENTION = (torch.ops.aten.scaled_dot_product_attention.default,
              torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)


def _attention_mask(node: torch.fx.Node) -> Any:
    if "attn_mask" in node.kwargs:
        return node.kwargs["attn_mask"]
    if node.target == _ATTENTION[0] and len(node.args) > 3:
        return node.args[3]
    return None


def _as_causal(target: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """An attention's arguments with its mask dropped and the causal flag set."""
    kwargs = dict(kwargs)
    if "attn_mask" in kwargs:
        kwargs["attn_mask"] = None
    else:
        args = args[:3] + (None,) + args[4:]
    flag = 5 if target == _ATTENTION[0] else 4  # is_causal's position
    if len(args) > flag:
        args = args[:flag] + (True,) + args[flag + 1:]
    else:
        kwargs["is_causal"] = True
    return args, kwargs


_OWN_BROADCAST = frozenset({
    torch.ops.aten.add.Tensor, torch.ops.aten.add.Scalar, torch.ops.aten.sub.Tensor,
    torch.ops.aten.sub.Scalar, torch.ops.aten.rsub.Tensor, torch.ops.aten.rsub.Scalar,
    torch.ops.aten.mul.Tensor, torch.ops.aten.mul.Scalar, torch.ops.aten.div.Tensor,
    torch.ops.aten.div.Scalar})


def _broadcast_half(value: Any, shape: tuple[int, ...]) -> Any:
    """A half-precision operand of a pointwise op that broadcasts to the op's ``shape``,
    broadcast with a float32-summed gradient (``ops._util.broadcast_accumulating``);
    anything else unchanged."""
    if not isinstance(value, jax.Array) or value.shape == shape or value.ndim > len(shape):
        return value
    try:
        if jnp.broadcast_shapes(value.shape, shape) != shape:
            return value
    except ValueError:
        return value
    return broadcast_accumulating(value, shape)


def _aval(value: Any) -> Any:
    """Shape and dtype of a node's value (tensors, nested in tuples), else its repr."""
    if isinstance(value, (torch.Tensor, jax.Array, np.ndarray)):
        return tuple(int(d) for d in value.shape), str(value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(_aval(v) for v in value)
    return repr(value)


def _described(value: Any, roles: dict[torch.fx.Node, tuple]) -> Any:
    """``value`` (a node's arguments) as a hashable tree: nodes by their roles."""
    if isinstance(value, torch.fx.Node):
        return roles.get(value, ("outside", value.name))
    if isinstance(value, (tuple, list)):
        return type(value).__name__ == "tuple", tuple(_described(v, roles) for v in value)
    if isinstance(value, dict):
        return tuple((k, _described(v, roles)) for k, v in value.items())
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return type(value).__name__, value


_CONTAINERS = {"Sequential", "ModuleList", "ModuleDict"}


def layer_path(node: torch.fx.Node) -> str | None:
    """The layer ``node`` belongs to: the first module below the root that is not a
    container (``Sequential``, ``ModuleList``, ``ModuleDict``); None for the root's
    own forward."""
    for path, cls in (node.meta.get("nn_module_stack") or {}).values():
        name = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
        if path and not (name.startswith("torch.nn.modules.container.")
                         and name.rsplit(".", 1)[-1] in _CONTAINERS):
            return path
    return None


def _missing_key_error(nodes: list[torch.fx.Node]):
    from cerebrax.errors import ConfigError

    uses = ", ".join(f"{n.target} in {module_path(n)}" for n in nodes[:3])
    return ConfigError(
        f"This graph has random ops ({uses}) and needs a PRNG key: call "
        "apply(params, buffers, *inputs, key=jax.random.key(seed)) with a fresh key per step."
    )


def _conform(value: Any, meta: Any, node: torch.fx.Node) -> Any:
    """Gives a lowering's result torch's dtype category and checks its shape.

    Within floating types the lowering's dtype is kept (mixed precision runs a float32
    export on float16 values); across categories (bool, int, float) torch's wins.
    """
    if isinstance(meta, torch.Tensor):
        return _conform_array(value, meta, node)
    if isinstance(meta, (tuple, list)) and isinstance(value, (tuple, list)):
        return type(value)(_conform(v, m, node) for v, m in zip(value, meta))
    return value


def _conform_array(value: Any, meta: torch.Tensor, node: torch.fx.Node) -> jax.Array:
    target = jax_dtype(meta.dtype)
    if not hasattr(value, "dtype"):
        value = jnp.asarray(value, dtype=target)
    if value.dtype != target:
        same_kind = (jnp.issubdtype(value.dtype, jnp.floating)
                     and jnp.issubdtype(target, jnp.floating))
        if not same_kind:
            value = value.astype(target)
    expected = tuple(int(d) for d in meta.shape)
    if tuple(value.shape) != expected:
        raise AssertionError(
            f"torch_bridge: the lowering of {node.target} (module {module_path(node)}) "
            f"returned shape {tuple(value.shape)}, torch gives {expected}. This is a bug "
            "in the lowering."
        )
    return value
