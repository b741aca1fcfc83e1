"""Exported graphs kept across processes: a script run again loads its model's graph
instead of exporting it.

Exporting a model (``torch.export``, decomposition to core ATen, the bridge's rewrites)
costs a second or more, and importing ``torch.export``'s machinery another 2 s, every
time a script starts. Where cerebrax's compilation cache is on
(:mod:`cerebrax.backend`), the finished graph is written to ``torch_export/`` in the
cache's folder, and a later process that exports the same module for the same call
loads it: the ops, their arguments, each value's shape and dtype, the module paths,
the input and output structure and the constant tensors, exactly as exported.

A stale graph would train silently differently, so the key misses on any change to
what the export read, as far as it can be seen, and a graph whose making cannot be
seen is not kept at all. The key holds:

- **the code**: every Python file loaded when the graph was exported (the script, its
  modules, torch, transformers, the bridge itself), by path, size and modification
  time; torch's and Python's versions;
- **the module**: every submodule's path and class, its parameters' and buffers'
  names, shapes, dtypes and ties, and every other attribute's value (numbers,
  strings, containers, tensors by content, configuration objects field by field);
- **the state its code reads**: the values of the globals that the classes' methods
  (and the functions they call, and the modules they name) refer to, and the methods'
  default arguments and closures;
- **the call**: the mode, the inputs' structure, shapes and dtypes, Python inputs by
  value, the autocast state and torch's default dtype.

Not kept (every call exports afresh): a class or function defined inside a function or
in code with no file (a notebook cell, ``python -c``), a module with forward hooks (or
global ones), a graph that calls back into Python (custom autograd Functions, tensor
and module hooks, side calls), an attribute of a kind the key cannot read, and any
graph whose pieces the format does not hold. What ``forward`` reads from elsewhere
(an environment variable, a file, a global of a module it does not name) is beyond
the key: ``CEREBRAX_EXPORT_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import io
import os
import pickle
import sys
import tempfile
import types
import weakref
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import (InputKind, InputSpec, OutputKind, OutputSpec,
                                          TensorArgument)

from cerebrax._runtime import RUNTIME

from ._program import _PYTHON_OPS

__all__ = ["ENV", "directory", "key", "load", "save"]

ENV = "CEREBRAX_EXPORT_CACHE"
_FORMAT = 2
_MAX_DEPTH = 12
_MAX_OBJECTS = 200_000  # a key that would read more objects than this is not made


class _Unkeyable(Exception):
    """What the export read cannot be put in the key: the graph is not kept."""


def directory() -> str | None:
    """The folder graphs are kept in, or None where the cache is off."""
    base = RUNTIME.export_cache_dir
    if base is None or os.environ.get(ENV, "1").strip().lower() in ("0", "false", "off",
                                                                    "no"):
        return None
    return base


# ---- the key ------------------------------------------------------------------------
def _is_local(obj: Any) -> bool:
    qualname = getattr(obj, "__qualname__", "") or ""
    return "<locals>" in qualname or "<lambda>" in qualname


def _has_file(module_name: str | None) -> bool:
    module = sys.modules.get(module_name or "")
    path = getattr(module, "__file__", None)
    return isinstance(path, str) and os.path.isfile(path)


_LIBRARY_DIRS = ("site-packages", "dist-packages")


@functools.lru_cache(maxsize=None)
def _library_file(path: str) -> bool:
    parts = set(os.path.normpath(path).split(os.sep))
    return any(d in parts for d in _LIBRARY_DIRS)


def _is_library(module: types.ModuleType) -> bool:
    """A module of Python itself or of an installed package: its code is in the key (by
    file), its run-time state is not read (installed packages keep none that changes a
    graph). An editable install, like the script's own modules, is read."""
    name = module.__name__.split(".")[0]
    if name in sys.stdlib_module_names or name in ("builtins", "torch"):
        return True
    path = getattr(module, "__file__", None)
    return isinstance(path, str) and _library_file(path)


class _Encoder:
    """Writes the state an export reads as a canonical text, object by object."""

    def __init__(self, state: dict[int, str] | None = None) -> None:
        self.out = io.StringIO()
        self._seen: dict[int, int] = {}
        self._keep: list[Any] = []  # ids stay unique while encoding
        self._functions: set[int] = set()
        self._modules: set[str] = set()
        self._state = state or {}  # id -> name of the module's own parameters, buffers

    def write(self, *parts: Any) -> None:
        for part in parts:
            self.out.write(repr(part) if not isinstance(part, str) else part)
            self.out.write("\x1f")

    def value(self, x: Any, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise _Unkeyable("nested too deeply")
        if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
            self.write(type(x).__name__, x)
            return
        if isinstance(x, (torch.dtype, torch.device, torch.layout, torch.memory_format,
                          torch.Size, range, slice, type(Ellipsis))):
            self.write(type(x).__name__, x)
            return
        if isinstance(x, enum.Enum):
            self.write("enum", type(x).__module__, type(x).__qualname__, x.name)
            return
        if isinstance(x, np.generic):
            self.write("numpy", type(x).__name__, x.item())
            return
        if isinstance(x, pytree.TreeSpec):
            try:
                self.write("treespec", pytree.treespec_dumps(x))
            except Exception as error:  # noqa: BLE001 - a structure pytree cannot write
                raise _Unkeyable(f"a call structure: {error}") from error
            return
        ident = id(x)
        if ident in self._state:
            self.write("state", self._state[ident])
            return
        if ident in self._seen:
            self.write("ref", self._seen[ident])
            return
        if len(self._seen) >= _MAX_OBJECTS:
            raise _Unkeyable("too many objects")
        self._seen[ident] = len(self._seen)
        self._keep.append(x)
        if isinstance(x, torch.Tensor):
            self.tensor(x)
        elif isinstance(x, np.ndarray):
            self.write("ndarray", x.shape, str(x.dtype),
                       hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest())
        elif isinstance(x, (tuple, list, set, frozenset)):
            items = list(x)
            if isinstance(x, (set, frozenset)):
                items = sorted(items, key=repr)
            self.write(type(x).__name__, len(items))
            for item in items:
                self.value(item, depth + 1)
        elif isinstance(x, dict):
            self.write("dict", type(x).__qualname__, len(x))
            for k, v in x.items():
                self.value(k, depth + 1)
                self.value(v, depth + 1)
        elif isinstance(x, torch.nn.Module):
            self.write("module", type(x).__module__, type(x).__qualname__)
        elif isinstance(x, type):
            self.code_owner(x)
            self.write("class", x.__module__, x.__qualname__)
        elif isinstance(x, (types.FunctionType, types.MethodType, functools.partial,
                            types.BuiltinFunctionType)):
            self.callable(x, depth)
        elif isinstance(x, types.ModuleType):
            self.write("modref", x.__name__)
        elif isinstance(x, weakref.ref):  # nn.RNNBase keeps its weights' references
            self.write("weakref")
            self.value(x(), depth + 1)
        elif dataclasses.is_dataclass(x) or hasattr(x, "__dict__") or hasattr(
                type(x), "__slots__"):
            self.obj(x, depth)
        else:
            raise _Unkeyable(f"an attribute of type {type(x).__name__}")

    def tensor(self, t: torch.Tensor) -> None:
        if t.device.type == "meta" or getattr(t, "fake_mode", None) is not None:
            raise _Unkeyable("a tensor with no values")
        digest = hashlib.sha256(_raw(t)).hexdigest()
        self.write("tensor", tuple(t.shape), t.dtype, t.requires_grad, digest)

    def obj(self, x: Any, depth: int) -> None:
        cls = type(x)
        self.code_owner(cls)
        self.write("object", cls.__module__, cls.__qualname__)
        state = dict(getattr(x, "__dict__", {}))
        for slots in (getattr(c, "__slots__", ()) for c in cls.__mro__):
            for name in ([slots] if isinstance(slots, str) else slots):
                if name not in ("__dict__", "__weakref__") and hasattr(x, name):
                    state[name] = getattr(x, name)
        for name in sorted(state):
            self.write(name)
            self.value(state[name], depth + 1)

    def callable(self, f: Any, depth: int) -> None:
        if isinstance(f, functools.partial):
            self.write("partial")
            self.value(f.func, depth + 1)
            self.value(f.args, depth + 1)
            self.value(f.keywords, depth + 1)
            return
        if isinstance(f, types.MethodType):
            self.write("method", f.__func__.__qualname__)
            self.value(f.__self__, depth + 1)
            self.function(f.__func__)
            return
        if isinstance(f, types.BuiltinFunctionType):
            self.write("builtin", getattr(f, "__module__", None), f.__qualname__)
            return
        self.write("function", f.__module__, f.__qualname__)
        self.function(f)

    def code_owner(self, obj: Any) -> None:
        if _is_local(obj) or not _has_file(getattr(obj, "__module__", None)):
            if getattr(obj, "__module__", None) != "builtins":
                raise _Unkeyable(f"{obj!r} is not defined at module level of a file")

    def function(self, f: types.FunctionType) -> None:
        """The state ``f``'s code reads: defaults, closure, the globals it names (and
        the functions and modules among them, in turn)."""
        if id(f) in self._functions:
            return
        self._functions.add(id(f))
        self._keep.append(f)
        module = sys.modules.get(f.__module__ or "")
        if module is not None and _is_library(module):
            return
        self.code_owner(f)
        self.write("defaults")
        self.value(f.__defaults__, 1)
        self.value(f.__kwdefaults__, 1)
        if f.__closure__:
            self.write("closure")
            for cell in f.__closure__:
                self.value(cell.cell_contents, 1)
        for name in sorted(_names(f.__code__)):
            if name in f.__globals__:
                self.global_value(name, f.__globals__[name])

    def global_value(self, name: str, x: Any) -> None:
        self.write("global", name)
        if isinstance(x, types.FunctionType):
            self.write("function", x.__module__, x.__qualname__)
            self.function(x)
        elif isinstance(x, types.ModuleType):
            self.module_globals(x)
        elif isinstance(x, type):
            self.write("class", x.__module__, x.__qualname__)
            if not _is_library(sys.modules.get(x.__module__) or torch):
                self.class_code(x)
        else:
            try:
                self.value(x, 1)
            except _Unkeyable:
                self.write("opaque", type(x).__qualname__)

    def module_globals(self, module: types.ModuleType) -> None:
        self.write("module", module.__name__)
        if _is_library(module) or module.__name__ in self._modules:
            return
        self._modules.add(module.__name__)
        for name, x in sorted(vars(module).items()):
            if name.startswith("__") or isinstance(x, (types.ModuleType, type,
                                                       types.FunctionType)):
                continue
            self.write("global", name)
            try:
                self.value(x, 1)
            except _Unkeyable:
                self.write("opaque", type(x).__qualname__)

    def class_code(self, cls: type) -> None:
        """The state the methods of ``cls`` (and its bases) read; of a library's class,
        which functions its methods are (a method patched at run time is another)."""
        for klass in cls.__mro__:
            module = sys.modules.get(klass.__module__)
            if klass is object or module is None:
                continue
            library = _is_library(module)
            if not library:
                self.code_owner(klass)
            for name, member in sorted(vars(klass).items()):
                for f in _functions_of(member):
                    self.write("member", klass.__qualname__, name, f.__module__,
                                f.__qualname__)
                    if not library:
                        self.function(f)


def _functions_of(member: Any) -> list[types.FunctionType]:
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, property):
        return [f for f in (member.fget, member.fset) if isinstance(f, types.FunctionType)]
    return [member] if isinstance(member, types.FunctionType) else []


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
               "_backward_pre_hooks")
_MODULE_SKIP = {"_parameters", "_buffers", "_modules", "training", "_non_persistent_buffers_set",
                "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                "_load_state_dict_post_hooks", "_forward_hooks_with_kwargs",
                "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
                "_is_full_backward_hook", *_HOOK_DICTS}


def _global_hooks() -> bool:
    from torch.nn.modules import module as torch_module

    return any(getattr(torch_module, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks"))


def _torch_functions(encoder: _Encoder) -> None:
    """Which function each name of torch's namespaces that models call is: a function
    patched in at run time (``torch.nn.functional.gelu = mine``) is another."""
    for namespace in (torch, torch.nn.functional, torch.nn.init, torch.Tensor,
                      torch.linalg, torch.special, torch.fft):
        for name, value in sorted(vars(namespace).items()):
            if isinstance(value, (types.FunctionType, types.BuiltinFunctionType,
                                  types.MethodDescriptorType, functools.partial)):
                encoder.write(name, getattr(value, "__module__", None),
                              getattr(value, "__qualname__", None))


def key(module: torch.nn.Module, call: Any) -> str | None:
    """The key of ``module``'s graph for ``call`` (the call's signature: mode, input
    structure, shapes, dtypes, Python values), or None where the export's inputs cannot
    all be put in it (then the graph is not kept)."""
    if _global_hooks():
        return None
    state = {id(t): f"{kind}:{name}" for kind, named in (
        ("param", module.named_parameters(remove_duplicate=False)),
        ("buffer", module.named_buffers(remove_duplicate=False))) for name, t in named}
    encoder = _Encoder(state)
    try:
        encoder.write("format", _FORMAT, sys.version, torch.__version__,
                      torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled())
        _torch_functions(encoder)
        encoder.value(call)
        classes = {}
        for path, sub in module.named_modules(remove_duplicate=False):
            if any(getattr(sub, name, None) for name in _HOOK_DICTS):
                return None
            cls = type(sub)
            classes[(cls.__module__, cls.__qualname__)] = cls
            encoder.write("submodule", path, cls.__module__, cls.__qualname__)
            for kind, tensors in (("param", sub.named_parameters(recurse=False)),
                                  ("buffer", sub.named_buffers(recurse=False))):
                for name, t in tensors:
                    encoder.write(kind, name, tuple(t.shape), t.dtype, t.requires_grad,
                                  ("tie", id(t)))
            for name, value in sorted(vars(sub).items()):
                if name not in _MODULE_SKIP:
                    encoder.write("attribute", name)
                    encoder.value(value)
        for cls in classes.values():
            encoder.class_code(cls)
    except _Unkeyable:
        return None
    # Ties by identity: number each tensor by first appearance instead of its id.
    text = encoder.out.getvalue()
    return hashlib.sha256(_renumber_ties(text).encode()).hexdigest()


def _renumber_ties(text: str) -> str:
    parts = text.split("\x1f")
    numbers: dict[str, str] = {}
    for i, part in enumerate(parts):
        if part.startswith("('tie', "):
            parts[i] = numbers.setdefault(part, f"tie{len(numbers)}")
    return "\x1f".join(parts)


# ---- the files the graph was exported from --------------------------------------------
def _loaded_files() -> list[tuple[str, int, int]]:
    files = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path not in files:
            try:
                stat = os.stat(path)
            except OSError:
                continue
            files[path] = (stat.st_mtime_ns, stat.st_size)
    return sorted((p, m, s) for p, (m, s) in files.items())


def _files_unchanged(files: list[tuple[str, int, int]]) -> bool:
    for path, mtime, size in files:
        try:
            stat = os.stat(path)
        except OSError:
            return False
        if stat.st_mtime_ns != mtime or stat.st_size != size:
            return False
    return True


# ---- the graph, as plain data ---------------------------------------------------------
# The Python functions a graph may call (torch_bridge._program), by qualified name.
_PYTHON_FUNCTIONS = {f"{f.__module__}.{f.__name__}": f for f in _PYTHON_OPS}
_PYTHON_NAMES = {f: name for name, f in _PYTHON_FUNCTIONS.items()}
_KEPT_CUSTOM = ("torch_bridge::stop_gradient",)


def _target(target: Any) -> tuple:
    if isinstance(target, torch._ops.OpOverload):
        namespace = target.namespace
        if namespace == "torch_bridge" and target._schema.name not in _KEPT_CUSTOM:
            raise _Unkeyable("a graph that calls back into Python")
        return ("op", target._schema.name, target._overloadname)
    name = _PYTHON_NAMES.get(target)
    if name is None:
        raise _Unkeyable(f"graph target {target!r}")
    return ("py", name)


def _op(ref: tuple) -> Any:
    if ref[0] == "py":
        return _PYTHON_FUNCTIONS[ref[1]]
    namespace, name = ref[1].split("::")
    return getattr(getattr(getattr(torch.ops, namespace), name), ref[2])


def _raw(t: torch.Tensor) -> bytes:
    """A tensor's values as bytes, in row-major order (any dtype, bfloat16 included)."""
    data = t.detach().cpu().contiguous()
    return data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""


def _tensor_data(t: torch.Tensor) -> tuple:
    return ("tensor", tuple(t.shape), str(t.dtype).removeprefix("torch."), _raw(t),
            t.requires_grad)


def _tensor_from(data: tuple) -> torch.Tensor:
    _, shape, dtype, raw, requires_grad = data
    dtype = getattr(torch, dtype)
    if raw:
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
    else:
        t = torch.empty(shape, dtype=dtype)
    return t.requires_grad_(requires_grad)


def _plain(x: Any, nodes: dict) -> Any:
    """A node argument (or meta value) as plain data."""
    if isinstance(x, torch.fx.Node):
        return ("node", x.name)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (list, tuple)):  # FX's immutable_list is a list
        return ("tuple" if isinstance(x, tuple) else "list", [_plain(v, nodes) for v in x])
    if isinstance(x, dict):
        return ("dict", [(k, _plain(v, nodes)) for k, v in x.items()])
    if isinstance(x, torch.dtype):
        return ("dtype", str(x).removeprefix("torch."))
    if isinstance(x, torch.device):
        return ("device", str(x))
    if isinstance(x, torch.layout):
        return ("layout", str(x).removeprefix("torch."))
    if isinstance(x, torch.memory_format):
        return ("memory_format", str(x).removeprefix("torch."))
    if isinstance(x, slice):
        return ("slice", [_plain(v, nodes) for v in (x.start, x.stop, x.step)])
    raise _Unkeyable(f"graph argument {type(x).__name__}")


def _unplain(x: Any, nodes: dict) -> Any:
    if not isinstance(x, tuple):
        return x
    kind, body = x[0], x[1]
    if kind == "node":
        return nodes[body]
    if kind in ("list", "tuple"):
        items = [_unplain(v, nodes) for v in body]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _unplain(v, nodes) for k, v in body}
    if kind in ("dtype", "layout", "memory_format"):
        return getattr(torch, body)
    if kind == "device":
        return torch.device(body)
    if kind == "slice":
        return slice(*(_unplain(v, nodes) for v in body))
    raise ValueError(f"unknown entry {kind!r}")


def _val(v: Any) -> Any:
    """A node's ``meta["val"]``: tensors by shape and dtype."""
    if isinstance(v, torch.Tensor):
        if any(not isinstance(d, int) for d in v.shape):
            raise _Unkeyable("a symbolic shape")
        return ("val", tuple(int(d) for d in v.shape), str(v.dtype).removeprefix("torch."))
    if isinstance(v, (list, tuple)):
        return ("tuple" if isinstance(v, tuple) else "list", [_val(x) for x in v])
    if v is None or isinstance(v, (bool, int, float)):
        return v
    raise _Unkeyable(f"a node value of type {type(v).__name__}")


def _unval(v: Any) -> Any:
    if not isinstance(v, tuple):
        return v
    if v[0] == "val":
        return torch.empty(v[1], dtype=getattr(torch, v[2]), device="meta")
    items = [_unval(x) for x in v[1]]
    return items if v[0] == "list" else tuple(items)


def _module_stack(stack: Any) -> Any:
    if not stack:
        return None
    return [(k, path, cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}")
            for k, (path, cls) in stack.items()]


def _graph_data(exported: Any) -> dict:
    graph = exported.graph_module.graph
    nodes = []
    for node in graph.nodes:
        if node.op not in ("placeholder", "call_function", "output"):
            raise _Unkeyable(f"a {node.op} node")
        target = node.target if node.op != "call_function" else _target(node.target)
        nodes.append((node.name, node.op, target, _plain(node.args, {}),
                      _plain(node.kwargs, {}), _val(node.meta.get("val")),
                      _module_stack(node.meta.get("nn_module_stack"))))
    signature = exported.graph_signature
    inputs = [(s.kind.name, getattr(s.arg, "name", None), s.target, s.persistent)
              for s in signature.input_specs]
    outputs = [(s.kind.name, getattr(s.arg, "name", None), s.target)
               for s in signature.output_specs]
    constants = {name: _tensor_data(t) for name, t in exported.constants.items()
                 if isinstance(t, torch.Tensor)}
    if len(constants) != len(exported.constants):
        raise _Unkeyable("a constant that is not a tensor")
    try:
        specs = (pytree.treespec_dumps(exported.call_spec.in_spec),
                 pytree.treespec_dumps(exported.call_spec.out_spec))
    except Exception as error:  # noqa: BLE001 - a structure pytree cannot write
        raise _Unkeyable(f"the call's structure: {error}") from error
    return {"nodes": nodes, "inputs": inputs, "outputs": outputs, "constants": constants,
            "specs": specs}


@dataclasses.dataclass
class Restored:
    """A kept graph, with what :class:`torch_bridge.Program` reads of an
    ``ExportedProgram``."""

    graph_module: Any
    graph_signature: Any
    call_spec: Any
    constants: dict


def _restore(data: dict) -> Restored:
    graph = torch.fx.Graph()
    nodes: dict[str, torch.fx.Node] = {}
    for name, op, target, args, kwargs, val, stack in data["nodes"]:
        if op == "call_function":
            target = _op(target)
        # FX may rename a node ("input" shadows a builtin): the specs follow it.
        node = graph.create_node(op, target, _unplain(args, nodes), _unplain(kwargs, nodes),
                                 name=name)
        if val is not None:
            node.meta["val"] = _unval(val)
        if stack is not None:
            node.meta["nn_module_stack"] = {k: (path, cls) for k, path, cls in stack}
        nodes[name] = node
    names = {name: node.name for name, node in nodes.items()}
    inputs = [InputSpec(kind=InputKind[kind], arg=TensorArgument(name=names.get(arg, arg)),
                        target=target, persistent=persistent)
              for kind, arg, target, persistent in data["inputs"]]
    outputs = [OutputSpec(kind=OutputKind[kind], arg=TensorArgument(name=names.get(arg, arg)),
                          target=target) for kind, arg, target in data["outputs"]]
    in_spec, out_spec = (pytree.treespec_loads(s) for s in data["specs"])
    return Restored(graph_module=types.SimpleNamespace(graph=graph),
                    graph_signature=types.SimpleNamespace(input_specs=inputs,
                                                          output_specs=outputs),
                    call_spec=types.SimpleNamespace(in_spec=in_spec, out_spec=out_spec),
                    constants={k: _tensor_from(v) for k, v in data["constants"].items()})


class _PlainUnpickler(pickle.Unpickler):
    """Reads plain data only: a kept graph never names a class or function."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} in a kept graph")


def _path(folder: str, key: str) -> str:
    return os.path.join(folder, f"{key}.graph")


def load(folder: str, key: str) -> Restored | None:
    """The graph kept under ``key``, or None (none kept, or its files changed since)."""
    try:
        with open(_path(folder, key), "rb") as f:
            entry = _PlainUnpickler(f).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError):
        return None
    if entry.get("format") != _FORMAT or not _files_unchanged(entry["files"]):
        return None
    try:
        return _restore(entry["graph"])
    except Exception:  # noqa: BLE001 - an entry this torch cannot read is exported again
        return None


def save(folder: str, key: str, exported: Any) -> bool:
    """Keeps ``exported`` (the finished graph) under ``key``, with the files loaded now;
    returns whether it was kept (a graph the format cannot hold is not)."""
    try:
        graph = _graph_data(exported)
    except _Unkeyable:
        return False
    entry = {"format": _FORMAT, "files": _loaded_files(), "graph": graph}
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=folder, delete=False,
                                         suffix=".tmp") as f:
            pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(f.name, _path(folder, key))
    except OSError:
        return False
    return True
