"""The package's layers point one way, and no module reads another folder's private names.

A folder is a package directory (``cerebrax/wse``, ``torch_bridge/ops``); a module directly
in ``cerebrax/`` counts as its own folder (``cerebrax/_filters.py``, ``cerebrax/trace.py``).
The layers, from the bottom, are :data:`LAYERS`: a folder may import folders of its own
layer or below, never above, and the folder graph has no cycle. Imports under
``if TYPE_CHECKING:`` do not count; imports inside functions do. Some folders show only
their ``__init__`` (:data:`SEALED_FOLDERS`) and keep an order among their modules
(:data:`MODULE_LAYERS`), and code outside the trace context's module uses only the
interface ``ActiveContext`` declares. The Layout section of docs/development.md describes
the same rules.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("cerebrax", "torch_bridge")

# Bottom first. A folder imports only folders of its own layer or lower ones.
LAYERS: list[tuple[str, ...]] = [
    ("cerebrax.errors", "cerebrax._version"),
    ("cerebrax._runtime", "cerebrax._filters", "cerebrax._placement", "cerebrax._torch_compat",
     "cerebrax._fork_server", "cerebrax._startup_gc"),
    ("cerebrax._tree",),
    ("cerebrax._debug_names",),
    ("torch_bridge.ops",),
    ("torch_bridge",),
    ("cerebrax._step",),
    ("cerebrax.wse",),
    ("cerebrax.backend",),
    ("cerebrax.core", "cerebrax.lib"),
    ("cerebrax._precision",),
    ("cerebrax.models",),
    ("cerebrax._step.traced",),
    ("cerebrax.trace", "cerebrax.schedules", "cerebrax.metrics", "cerebrax.ckpt",
     "cerebrax.nn", "cerebrax.sparse", "cerebrax.experimental", "cerebrax.cirh",
     "cerebrax.profiler", "cerebrax.storage"),
    ("cerebrax.optim.transforms",),
    ("cerebrax.optim",),
    ("cerebrax.amp",),
    ("cerebrax.data", "cerebrax.summaries"),
    ("cerebrax.utils", "cerebrax.utils.data", "cerebrax.distributed"),
    ("cerebrax.legacy", "cerebrax.estimator"),
    ("cerebrax._cli", "cerebrax._cstorch_alias"),
    ("cerebrax.cli",),
    ("cerebrax", "cerebrax.__main__", "cerebrax.ckpt.__main__",
     "cerebrax._alias.cerebras.pytorch", "cerebrax._alias.cerebras.appliance",
     "cerebrax._alias.cerebras.appliance.cluster", "cerebrax._alias.cerebras.appliance.storage",
     "cerebrax._alias.cerebras.appliance.utils"),
]


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def folder(module: str) -> str:
    """The folder a module belongs to (see the module docstring)."""
    path = MODULES[module]
    if path.name == "__init__.py" or module.endswith(".__main__"):
        return module
    parent = module.rsplit(".", 1)[0]
    return module if parent == "cerebrax" else parent


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    return skipped


def _resolve(module: str, node: ast.ImportFrom | ast.Import
             ) -> list[tuple[str, str | None, str]]:
    """``(imported module, imported name or None, local name)`` of one import statement."""
    if isinstance(node, ast.Import):
        return [(alias.name, None, alias.asname or alias.name.split(".")[0])
                for alias in node.names]
    if node.level:
        package = module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [(source, alias.name, alias.asname or alias.name) for alias in node.names]


def _target(name: str) -> str | None:
    """The module of ours that ``name`` (a dotted module path) lands in, or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _scan() -> tuple[dict[str, set[str]], list[str], list[str]]:
    """The folder graph, its edges by module, and the private-name reads across folders."""
    graph: dict[str, set[str]] = {}
    where: list[str] = []
    private: list[str] = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_nodes(tree)
        aliases: dict[str, str] = {}  # local name -> module of ours it is bound to
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for source, name, local in _resolve(module, node):
                if source.split(".")[0] not in PACKAGES:
                    continue
                as_module = f"{source}.{name}" if name else source
                target = _target(as_module) if as_module in MODULES else _target(source)
                if target is None:
                    continue
                a, b = folder(module), folder(target)
                if name and as_module in MODULES:
                    aliases[local] = as_module
                elif name is None:
                    bound = source if local != source.split(".")[0] else local
                    if bound in MODULES:
                        aliases[local] = bound
                if a == b:
                    continue
                graph.setdefault(a, set()).add(b)
                where.append(f"{module} -> {target}")
                if (name and as_module not in MODULES and name.startswith("_")
                        and not name.startswith("__")):
                    private.append(f"{module} imports {name} from {source}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                target = aliases[node.value.id]
                if folder(target) != folder(module):
                    private.append(f"{module} reads {target}.{node.attr}")
    return graph, where, private


GRAPH, EDGES, PRIVATE = _scan()


def _layer_of(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        if name in layer:
            return index
    raise AssertionError(
        f"folder {name!r} is in no layer: add it to LAYERS (and docs/development.md).")


def test_every_folder_has_a_layer():
    folders = {folder(m) for m in MODULES}
    for name in sorted(folders):
        _layer_of(name)


def test_no_import_runs_up_the_layers():
    upward = []
    for edge in EDGES:
        source, target = edge.split(" -> ")
        a, b = folder(source), folder(target)
        if _layer_of(b) > _layer_of(a):
            upward.append(f"{edge}  ({a} in layer {_layer_of(a)}, {b} in {_layer_of(b)})")
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one folder (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_folder_graph_has_no_cycle():
    assert _cycles(GRAPH) == []


def _module_graph() -> dict[str, set[str]]:
    """Imports between the modules of one folder (a package's ``__init__`` belongs to the
    folder it opens), imports inside functions included."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_nodes(tree)
        home = module if path.name == "__init__.py" else folder(module)
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for source, name, _ in _resolve(module, node):
                as_module = f"{source}.{name}" if name else source
                target = as_module if as_module in MODULES else _target(source)
                if target and target != module and (folder(target) == home
                                                    or target.startswith(home + ".")):
                    graph.setdefault(module, set()).add(target)
    return graph


def test_no_import_circle_inside_a_folder():
    """No two modules of a folder need each other, not even through an import inside a
    function: the shared piece moves below both, or one hands the other what it needs
    (a callable, a registration at import)."""
    cycles = sorted(_cycles(_module_graph()))
    assert not cycles, f"import circles inside a folder: {cycles}"


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_reads_a_private_name_of_another_folder():
    assert not PRIVATE, "private names read across folders:\n" + "\n".join(PRIVATE)


@pytest.mark.parametrize("source, expected", [
    ("from .errors import _secret\n", ["imports _secret"]),
    ("from ._step import _state\nx = _state._GENERATION\n",
     ["reads cerebrax._step._state._GENERATION"]),
    ("from .errors import ConfigError\n", []),
])
def test_the_private_name_check_sees_both_forms(source, expected, tmp_path, monkeypatch):
    # A module in cerebrax/wse reading another folder's private names, seen by the scan.
    fake = tmp_path / "cerebrax" / "wse" / "_probe.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(source.replace("from .", "from .."))
    monkeypatch.setitem(MODULES, "cerebrax.wse._probe", fake)
    _, _, private = _scan()
    mine = [p for p in private if p.startswith("cerebrax.wse._probe")]
    assert len(mine) == len(expected)
    for line, want in zip(mine, expected):
        assert want in line


# ---- folders that show only their __init__ ---------------------------------------------------
# Other folders import these folders' names from the folder's __init__ (its __all__), never
# a module inside: the folder may move a name between its modules without a change
# elsewhere. (A sub-folder is a folder of its own: cerebrax._step.traced is imported from
# its own __init__.)
SEALED_FOLDERS = ("cerebrax._step", "cerebrax._step.traced")


def _imports_inside(edges: list[str]) -> list[str]:
    """The edges (``module -> target``) that import a module inside a sealed folder."""
    return [f"{edge}  (import the name from {folder(edge.split(' -> ')[1])} instead)"
            for edge in edges
            if folder(edge.split(" -> ")[1]) in SEALED_FOLDERS
            and MODULES[edge.split(" -> ")[1]].name != "__init__.py"]


def test_other_folders_import_a_sealed_folder_from_its_init():
    inside = _imports_inside(EDGES)
    assert not inside, "modules of a sealed folder imported from outside:\n" + "\n".join(inside)


@pytest.mark.parametrize("source, flagged", [
    ("from .._step._state import Parameter\n", True),
    ("from .._step import _state\n", True),
    ("import cerebrax._step._trace_context\n", True),
    ("from .._step.traced._traced_step import TracedStep\n", True),
    ("from .._step import Parameter, active_context\n", False),
    ("from .. import _step\nx = _step.live_refs()\n", False),
    ("from .._step.traced import trace\n", False),
])
def test_the_sealed_folder_check_sees_each_form(source, flagged, tmp_path, monkeypatch):
    # A module in cerebrax/wse importing from cerebrax._step, seen by the scan.
    fake = tmp_path / "cerebrax" / "wse" / "_probe.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(source)
    monkeypatch.setitem(MODULES, "cerebrax.wse._probe", fake)
    _, edges, _ = _scan()
    mine = _imports_inside([e for e in edges if e.startswith("cerebrax.wse._probe ")])
    assert len(mine) == flagged, mine


# The modules of a folder that keep an order of their own, bottom first: a module imports
# only modules of its folder in its own entry or an earlier one (imports inside functions
# count, as everywhere here). The folder's __init__ may import them all.
MODULE_LAYERS = {
    "cerebrax._step": [("_active_context",), ("_interop",), ("_state",), ("_closures",),
                       ("_grad_regions", "_torch_parameters"), ("_trace_context",)],
}


def _module_order_breaks(graph: dict[str, set[str]]) -> list[str]:
    breaks = []
    for home, layers in MODULE_LAYERS.items():
        rank = {f"{home}.{name}": i for i, layer in enumerate(layers) for name in layer}
        for module, targets in graph.items():
            for target in targets:
                if module in rank and target in rank and rank[target] > rank[module]:
                    breaks.append(f"{module} -> {target}")
    return sorted(breaks)


def test_the_modules_of_a_folder_keep_their_order():
    for home, layers in MODULE_LAYERS.items():
        listed = {f"{home}.{name}" for layer in layers for name in layer}
        inside = {m for m in MODULES if folder(m) == home and m != home}
        assert listed == inside, f"{home}: list each of its modules in MODULE_LAYERS"
    breaks = _module_order_breaks(_module_graph())
    assert not breaks, "imports that run up a folder's module order:\n" + "\n".join(breaks)


def test_the_module_order_check_sees_an_import_up():
    graph = {"cerebrax._step._state": {"cerebrax._step._trace_context"},
             "cerebrax._step._trace_context": {"cerebrax._step._state"}}
    assert _module_order_breaks(graph) == [
        "cerebrax._step._state -> cerebrax._step._trace_context"]


def test_one_definition_of_is_array():
    import re

    pattern = re.compile(r"def _?is_array\b")
    hits = [str(p.relative_to(ROOT)) for p in MODULES.values() if pattern.search(p.read_text())]
    assert hits == ["cerebrax/_filters.py"]


# ---- one way to split a tree ------------------------------------------------------------
def _placeholder_merges(tree: ast.AST) -> list[int]:
    """Lines where a pytree is rebuilt from a placeholder list of its own making: an
    ``unflatten`` (JAX's or torch's) fed by a conditional expression that draws the next
    array (``[next(it) if x is SLOT else x for x in leaves]``), directly or through a
    name assigned in the same function. That is :func:`cerebrax._tree.combine`'s job."""
    def draws_next(node: ast.AST) -> bool:
        return any(isinstance(n, ast.IfExp) and any(
            isinstance(b, ast.Call) and isinstance(b.func, ast.Name) and b.func.id == "next"
            for b in (n.body, n.orelse)) for n in ast.walk(node))

    found = []
    for function in [n for n in ast.walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]:
        drawn = {t.id for n in ast.walk(function) if isinstance(n, ast.Assign)
                 and draws_next(n.value) for t in n.targets if isinstance(t, ast.Name)}
        for call in [n for n in ast.walk(function) if isinstance(n, ast.Call)]:
            name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(
                call.func, "id", "")
            if name.endswith("unflatten") and any(
                    draws_next(a) or (isinstance(a, ast.Name) and a.id in drawn)
                    for a in call.args):
                found.append(call.lineno)
    return sorted(set(found))


def test_trees_are_split_and_merged_by_one_module():
    found = [f"{name}:{line}" for name, path in MODULES.items() if name != "cerebrax._tree"
             for line in _placeholder_merges(ast.parse(path.read_text()))]
    assert not found, ("a tree rebuilt around placeholders outside cerebrax._tree; use "
                       "partition / combine:\n" + "\n".join(found))


@pytest.mark.parametrize("source, expected", [
    ("def f(t, s, a):\n    it = iter(a)\n"
     "    return jax.tree.unflatten(t, [next(it) if x is None else x for x in s])\n", 1),
    ("def f(t, s, a):\n    it = iter(a)\n    leaves = [next(it) if x is S else x for x in s]\n"
     "    return pytree.tree_unflatten(leaves, t)\n", 1),
    ("def f(t, s, a):\n    it = iter(a)\n"
     "    return t.unflatten([x if x is not S else next(it) for x in s])\n", 1),
    ("def f(t, leaves):\n"
     "    return jax.tree.unflatten(t, [np.asarray(x) if ok(x) else x for x in leaves])\n", 0),
    ("def f(t, leaves):\n    return jax.tree.unflatten(t, leaves)\n", 0),
])
def test_the_placeholder_merge_check_sees_each_form(source, expected):
    assert len(_placeholder_merges(ast.parse(source))) == expected


# ---- one owner of a traced step's state ---------------------------------------------------
# The trace context's own module, and the module that declares what others may use of it.
CONTEXT_MODULE = "cerebrax._step._trace_context"
PROTOCOL_MODULE = "cerebrax._step._active_context"
# Calls that give the trace context (the running one, or a new one), wherever they are
# made; a function of another module whose return annotation names a context type
# (below) gives one too, and so does, in its own module, a private one.
CONTEXT_CALLS = {"active_context", "context_with_grads", "TraceContext"}
CONTEXT_TYPES = re.compile(r"\b(ActiveContext|TraceContext)\b")
_MUTATORS = {"append", "extend", "add", "update", "setdefault", "pop", "clear", "remove",
             "insert", "discard", "popitem"}


def _protocol_members() -> set[str]:
    """What ``ActiveContext`` declares: the methods, properties and fields of its groups."""
    tree = ast.parse(MODULES[PROTOCOL_MODULE].read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def members(name: str) -> set[str]:
        found = set()
        for node in classes[name].body:
            if isinstance(node, ast.FunctionDef):
                found.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.add(node.target.id)
        for base in classes[name].bases:
            if isinstance(base, ast.Name) and base.id in classes:
                found |= members(base.id)
        return found

    return members("ActiveContext")


def _context_functions(trees: dict[str, ast.AST]) -> tuple[set[str], dict[str, set[str]]]:
    """The functions annotated to return a trace context: public ones by name, and each
    module's private ones."""
    public: set[str] = set()
    private: dict[str, set[str]] = {}
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns
                    is not None and CONTEXT_TYPES.search(ast.unparse(node.returns))):
                if node.name.startswith("_"):
                    private.setdefault(module, set()).add(node.name)
                else:
                    public.add(node.name)
    return public, private


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _own_nodes(scope: ast.AST) -> tuple[list[ast.AST], list[ast.AST]]:
    """The nodes of ``scope`` outside its nested functions, and those functions (the
    methods of a class defined in it count as nested in it)."""
    own, nested = [], []
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, _SCOPES):
            nested.append(node)
            continue
        if not isinstance(node, ast.ClassDef):
            own.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return own, nested


def _context_uses(tree: ast.AST, calls: set[str] = frozenset(CONTEXT_CALLS)
                  ) -> list[tuple[int, str, str]]:
    """Where ``tree`` uses a member of a trace context: ``(line, "reads" or "writes",
    member)``. A context is the result of a call in ``calls`` (``active_context()``), a
    name bound to one (whatever the name, also in a function nested where it is bound), or
    a parameter annotated with a context type. Writes are ``c.f = v``, ``c.f += v``,
    ``c.f[k] = v``, ``del c.f[k]`` and ``c.f.append(v)`` (or another mutating method);
    ``getattr(c, "f")`` reads ``f``."""
    def gives_context(value: ast.AST, names: set[str]) -> bool:
        if isinstance(value, ast.Call):
            func = value.func
            return (func.attr if isinstance(func, ast.Attribute)
                    else getattr(func, "id", None)) in calls
        return isinstance(value, ast.Name) and value.id in names

    def context_names(scope: ast.AST, own: list[ast.AST], outer: set[str]) -> set[str]:
        args = getattr(scope, "args", None)
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs] if args else []
        local = {a.arg for a in params} | {n.id for n in own if isinstance(n, ast.Name)
                                           and isinstance(n.ctx, ast.Store)}
        names = (outer - local) | {a.arg for a in params if a.annotation is not None
                                   and CONTEXT_TYPES.search(ast.unparse(a.annotation))}
        while True:  # names bound to a context, or to a name that holds one
            before = set(names)
            for node in own:
                if isinstance(node, ast.Assign) and gives_context(node.value, before):
                    names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and (
                        CONTEXT_TYPES.search(ast.unparse(node.annotation))
                        or node.value is not None and gives_context(node.value, before)):
                    names.add(node.target.id)
                elif isinstance(node, ast.NamedExpr) and gives_context(node.value, before):
                    names.add(node.target.id)
            if names == before:
                return names

    writes: set[tuple[int, int, str]] = set()
    reads: set[tuple[int, int, str]] = set()

    def visit(scope: ast.AST, outer: set[str]) -> None:
        own, nested = _own_nodes(scope)
        names = context_names(scope, own, outer)

        def member(node: ast.AST) -> ast.Attribute | None:
            while isinstance(node, ast.Subscript):
                node = node.value
            if isinstance(node, ast.Attribute) and gives_context(node.value, names):
                return node
            return None

        for node in own:
            targets: list = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in _MUTATORS):
                targets = [node.func.value]
            for target in targets:
                written = member(target)
                if written is not None:
                    writes.add((written.lineno, written.col_offset, written.attr))
            if isinstance(node, ast.Attribute) and gives_context(node.value, names):
                load = isinstance(node.ctx, ast.Load)
                (reads if load else writes).add((node.lineno, node.col_offset, node.attr))
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr"
                  and len(node.args) >= 2 and gives_context(node.args[0], names)
                  and isinstance(node.args[1], ast.Constant)):
                reads.add((node.lineno, node.col_offset, str(node.args[1].value)))
        for child in nested:
            visit(child, names)

    visit(tree, set())
    return sorted({(line, "writes", name) for line, _, name in writes}
                  | {(line, "reads", name) for line, col, name in reads
                     if (line, col, name) not in writes})


def _context_uses_outside() -> dict[str, list[tuple[int, str, str]]]:
    """Every module's uses of a trace context, but the context's own module's."""
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in MODULES.items()}
    public, private = _context_functions(trees)
    return {module: _context_uses(tree, CONTEXT_CALLS | public | private.get(module, set()))
            for module, tree in trees.items() if module != CONTEXT_MODULE}


def test_only_the_trace_context_writes_its_fields():
    """Gradients, bookkeeping and the skip condition are written through the context's
    own verbs (``set_grad``, ``record``, ``skip_writes_unless``, ...), so a value has one
    writer and one place where torch's ``.grad`` is kept in step; and no other module
    reads the context's private fields."""
    bad = [f"{module}:{line} {verb} the context's {name}"
           for module, uses in _context_uses_outside().items() for line, verb, name in uses
           if verb == "writes" or _is_private(name)]
    assert not bad, "trace context fields used outside its module:\n" + "\n".join(bad)


def test_code_outside_the_context_uses_only_its_declared_interface():
    """What other modules use of the context is ``ActiveContext``, its declared interface:
    a new use means a new, documented member there first."""
    members = _protocol_members()
    bad = [f"{module}:{line} {verb} {name}, which ActiveContext does not declare"
           for module, uses in _context_uses_outside().items() for line, verb, name in uses
           if name not in members and not name.startswith("__")]
    assert not bad, "undeclared uses of the trace context:\n" + "\n".join(bad)


def test_every_declared_member_of_the_context_is_used():
    """``ActiveContext`` declares what is used, no more: a member no other module uses
    leaves it."""
    used = {name for uses in _context_uses_outside().values() for _, _, name in uses}
    assert _protocol_members() <= used, sorted(_protocol_members() - used)


def test_the_context_class_defines_its_declared_interface():
    """Each member of ``ActiveContext`` is a method or property of ``TraceContext``, or a
    field its ``__init__`` sets (tests/trace checks ``isinstance`` on a live one)."""
    tree = ast.parse(MODULES[CONTEXT_MODULE].read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TraceContext"]
    defined = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    defined |= {n.attr for n in ast.walk(init) if isinstance(n, ast.Attribute)
                and isinstance(n.ctx, ast.Store) and getattr(n.value, "id", None) == "self"}
    assert _protocol_members() <= defined, sorted(_protocol_members() - defined)


@pytest.mark.parametrize("source, expected", [
    ("ctx = active_context()\nctx.grads[p] = g\n", [(2, "writes", "grads")]),
    ("ctx = _step.active_context()\nctx.condition = flag\n", [(2, "writes", "condition")]),
    ("ctx = active_context()\nctx.scratch.setdefault(k, {})\n", [(2, "writes", "scratch")]),
    ("ctx = active_context()\nctx.set_grad(p, g)\nx = ctx.grad(p)\n",
     [(2, "reads", "set_grad"), (3, "reads", "grad")]),
    # another name, a name bound to it, the call itself, a parameter of the type
    ("context = active_context()\ncontext.loss += 1\n", [(2, "writes", "loss")]),
    ("c = context_with_grads('x')\nd = c\nd.deferred.append(f)\n", [(3, "writes", "deferred")]),
    ("active_context()._records.clear()\n", [(1, "writes", "_records")]),
    ("def f(c: ActiveContext | None):\n    c.phase = 'x'\n", [(2, "writes", "phase")]),
    # reads of a private field, also through getattr
    ("def f():\n    c = active_context()\n    return c._grads\n", [(3, "reads", "_grads")]),
    ("c = active_context()\ng = getattr(c, '_grads', None)\n", [(2, "reads", "_grads")]),
    # not a context: another call's result, or the name in another function
    ("ctx = make()\nctx.grads[p] = g\n", []),
    ("def f():\n    ctx = active_context()\ndef g(ctx):\n    ctx.x = 1\n", []),
    # a function nested where the name is bound sees it
    ("def f():\n    c = active_context()\n    def g():\n        c.x = 1\n", [(4, "writes", "x")]),
])
def test_the_context_write_check_sees_each_form(source, expected):
    assert _context_uses(ast.parse(source)) == expected


@pytest.mark.parametrize("source, flagged", [
    ("c = active_context()\nc.grads[p] = g\n", ["writes the context's grads"]),
    ("c = active_context()\nx = c._condition\n", ["reads the context's _condition"]),
    ("c = active_context()\nc.set_grad(p, c.grad(p))\n", []),
])
def test_the_context_checks_fail_on_a_probe_module(source, flagged, monkeypatch, tmp_path):
    # A module in cerebrax/wse using the context, seen by the checks.
    fake = tmp_path / "_probe.py"
    fake.write_text(source)
    monkeypatch.setitem(MODULES, "cerebrax.wse._probe", fake)
    if flagged:
        with pytest.raises(AssertionError) as failure:
            test_only_the_trace_context_writes_its_fields()
        assert all(f"cerebrax.wse._probe:2 {want}" in str(failure.value) for want in flagged)
    else:
        test_only_the_trace_context_writes_its_fields()


def test_the_interface_check_sees_an_undeclared_member(monkeypatch, tmp_path):
    fake = tmp_path / "_probe.py"
    fake.write_text("def f(c: ActiveContext):\n    return c.values\n")
    monkeypatch.setitem(MODULES, "cerebrax.wse._probe", fake)
    with pytest.raises(AssertionError, match=r"_probe:2 reads values, which ActiveContext"):
        test_code_outside_the_context_uses_only_its_declared_interface()


# ---- private attributes stay in their folder -----------------------------------------------
def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_attributes(tree: ast.AST) -> set[str]:
    """The private attributes the classes of ``tree`` define: methods and class-level
    names, ``__slots__`` entries, and ``self._x = ...`` / ``cls._x = ...`` in methods."""
    found: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.add(node.name)
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            for target in targets:
                if isinstance(target, ast.Name):
                    found.add(target.id)
                    if target.id == "__slots__" and node.value is not None:
                        found.update(c.value for c in ast.walk(node.value)
                                     if isinstance(c, ast.Constant) and isinstance(c.value, str))
        for node in ast.walk(cls):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.add(node.attr)
    return {name for name in found if _is_private(name)}


def _foreign_attribute_uses(module: str, tree: ast.AST, owners: dict[str, set[str]]
                            ) -> list[str]:
    """Reads and writes in ``tree`` of a private attribute on an object other than
    ``self``/``cls``/``super()``, where the attribute is defined only by classes of
    other folders than ``module``'s."""
    mine = folder(module)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id == "super"):
            continue
        defined_in = owners.get(node.attr, set())
        if defined_in and mine not in defined_in:
            verb = "writes" if isinstance(node.ctx, (ast.Store, ast.Del)) else "reads"
            found.append(f"{module}:{node.lineno} {verb} {ast.unparse(node)} (an attribute of "
                         f"{', '.join(sorted(defined_in))})")
    return found


def _attribute_owners(trees: dict[str, ast.AST]) -> dict[str, set[str]]:
    owners: dict[str, set[str]] = {}
    for module, tree in trees.items():
        for name in _private_attributes(tree):
            owners.setdefault(name, set()).add(folder(module))
    return owners


def test_no_module_touches_a_private_attribute_of_another_folders_object():
    """``ref._value``, ``step._backend``, ``tensor._jax``, ``optimizer._all_params`` from
    another folder: each folder reaches the others' objects through their public names
    (``ref.stored``, ``step.backend``, ``torch_bridge.assign``, ``param_groups``)."""
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in MODULES.items()}
    owners = _attribute_owners(trees)
    uses = [use for m, tree in trees.items() for use in _foreign_attribute_uses(m, tree, owners)]
    assert not uses, "private attributes used across folders:\n" + "\n".join(uses)


@pytest.mark.parametrize("source, expected", [
    ("def f(ref):\n    return ref._value\n", ["reads ref._value"]),
    ("def f(ref, v):\n    ref._value = v\n", ["writes ref._value"]),
    ("def f(step):\n    return step._backend.name\n", ["reads step._backend"]),
    ("class A:\n    def f(self):\n        return self._value\n", []),
    ("def f(opt):\n    return opt._own\n", []),  # defined in this folder too
    ("def f(t):\n    return t._version\n", []),  # not an attribute of ours (torch's)
])
def test_the_private_attribute_check_sees_reads_and_writes(source, expected):
    owners = {"_value": {"cerebrax._step"}, "_backend": {"cerebrax._step.traced"},
              "_own": {"cerebrax.wse", "cerebrax._step.traced"}}
    # A module in cerebrax/wse, seen by the scan.
    uses = _foreign_attribute_uses("cerebrax.wse._memory", ast.parse(source), owners)
    assert len(uses) == len(expected), uses
    for use, want in zip(uses, expected):
        assert want in use


# ---- process state lives in RUNTIME --------------------------------------------------------
# The module-level names that change at run time outside cerebrax._runtime.RUNTIME, each
# with its reason. Anything else a module remembers between calls is a field of RUNTIME,
# where cstorch.reset() forgets it or keeps it by a stated rule.
MODULE_STATE_ALLOWED = {
    "cerebrax.metrics._base._TORCH_MODULE_CLASSES":
        "a cache: the torch Module class made for a metric class, the same whenever made",
    "cerebrax.storage.serializers.settings":
        "cstorch's public settings dict, which user code writes (its API, not ours)",
    "torch_bridge.ops._registry._LOWERINGS":
        "the op table: filled as the lowering modules import, like their functions",
}


def _module_state_changes(module: str, tree: ast.AST,
                          imported: dict[str, str] | None = None) -> set[str]:
    """The module-level names of ``module`` (or names ``imported`` from other modules:
    local name -> ``module.name``) that ``tree`` rebinds with ``global`` or changes in
    place: ``X.append(v)`` (or another mutating method), ``X[k] = v``, ``X[k] += v``,
    ``del X[k]``."""
    names = {}
    for node in getattr(tree, "body", []):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        names.update({t.id: f"{module}.{t.id}" for t in targets if isinstance(t, ast.Name)})
    names.update(imported or {})
    changed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            changed.update(names.get(n, f"{module}.{n}") for n in node.names)
        targets: list = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, ast.AugAssign):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in _MUTATORS | {"appendleft", "__setitem__"}):
            targets = [ast.Subscript(value=node.func.value)]
        for target in targets:
            if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                    and target.value.id in names):
                changed.add(names[target.value.id])
    return changed


def _imported_names(module: str, tree: ast.AST) -> dict[str, str]:
    """``from <a module of ours> import NAME``: local name -> ``module.NAME``."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for source, name, local in _resolve(module, node):
                if (source.split(".")[0] in PACKAGES and source in MODULES
                        and f"{source}.{name}" not in MODULES):
                    found[local] = f"{source}.{name}"
    return found


def test_process_state_lives_in_runtime():
    changed = set()
    for module, path in MODULES.items():
        if module != "cerebrax._runtime":
            tree = ast.parse(path.read_text(), str(path))
            changed |= _module_state_changes(module, tree, _imported_names(module, tree))
    assert len(MODULE_STATE_ALLOWED) <= 6
    outside = sorted(changed - set(MODULE_STATE_ALLOWED))
    assert not outside, (
        "module-level names changed at run time outside cerebrax._runtime.RUNTIME (make "
        "each a field of Runtime, which cstorch.reset() forgets or keeps):\n"
        + "\n".join(outside))
    assert changed == set(MODULE_STATE_ALLOWED), "an allowed name no longer changes: drop it"


@pytest.mark.parametrize("source, expected", [
    ("X = []\ndef f(v):\n    X.append(v)\n", {"m.X"}),
    ("X = {}\ndef f(k, v):\n    X[k] = v\n", {"m.X"}),
    ("X = [0]\ndef f():\n    X[0] += 1\n", {"m.X"}),
    ("X = {}\ndef f(k):\n    del X[k]\n", {"m.X"}),
    ("X = False\ndef f():\n    global X\n    X = True\n", {"m.X"}),
    ("from other import Y\ndef f(v):\n    Y.add(v)\n", {"other.Y"}),
    ("X = (1, 2)\ndef f(v):\n    seen = []\n    seen.append(v)\n    return X[0]\n", set()),
])
def test_the_module_state_check_sees_each_form(source, expected):
    tree = ast.parse(source)
    imported = {"Y": "other.Y"} if "import Y" in source else None
    assert _module_state_changes("m", tree, imported) == expected
