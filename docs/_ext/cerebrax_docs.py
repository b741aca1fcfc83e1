"""Sphinx extension of cerebrax's site: the pages generated from the code.

At ``builder-inited`` it writes, under ``docs/_generated/`` (never edited by hand):

- ``api/<module>.md``: one page per public module of ``cerebrax`` and ``torch_bridge``
  with every public name (see :func:`public_names`). A name re-exported from an earlier
  page is a link to it, so each object is described once.
- ``config_keys.md``: every key of the ``cerebrax`` command's config, from the schema the
  command validates against (``cerebrax._cli._reference``).
- ``notebooks/*.ipynb``: copies of the repository's notebooks, which myst-nb executes.
- ``figures/*.svg``: the wafer figures, drawn by ``wafer_figures.py`` in its own process
  (it needs 8 emulated devices) from cerebrax's recorded schedule and memory report.

A public function, class, method or property with no docstring is a warning, which the
build (``-W``) turns into an error.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pathlib
import pkgutil
import shutil
import subprocess
import sys
import types
import typing
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

DOCS = pathlib.Path(__file__).resolve().parent.parent
ROOT = DOCS.parent
GENERATED = DOCS / "_generated"
PACKAGES = ("cerebrax", "torch_bridge")
# torch_bridge's op families are lowering tables, not API: the torch_bridge page lists
# the ATen operators they lower instead.
LOWERING_TABLES = "torch_bridge.ops."
CHECKED = {"function", "class", "exception", "method", "property", "decorator", "data"}


# ---- which names are public --------------------------------------------------------------
def public_modules() -> list[str]:
    """The importable modules of both packages with no ``_``-prefixed component, package
    before its submodules."""
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            parts = info.name.split(".")
            if any(part.startswith("_") for part in parts):
                continue
            if info.name.startswith(LOWERING_TABLES):
                continue
            names.append(info.name)
    return sorted(names, key=lambda n: (n.split(".")[0] != "cerebrax", n.split(".")))


def public_names(module: Any) -> list[str]:
    """``__all__`` where the module has one; else what its source defines at top level
    (functions, classes, assignments) and what it re-exports as ``import x as x``, in
    source order, less ``_``-prefixed names."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [a.asname for a in node.names if a.asname and
                      a.asname == a.name.rsplit(".", 1)[-1]]
    seen: set[str] = set()
    return [n for n in names if not n.startswith("_") and not (n in seen or seen.add(n))]


# ---- the API pages --------------------------------------------------------------------------
def _directive(kind: str, target: str, *options: str) -> str:
    """An autodoc directive in a MyST page (autodoc writes reStructuredText)."""
    lines = [f".. {kind}:: {target}", *(f"   {option}" for option in options)]
    return "```{eval-rst}\n" + "\n".join(lines) + "\n```\n"


def _is_type_alias(value: Any) -> bool:
    """``X = Union[...]``, ``Callable[...]``, ``list[int]``, a TypeVar: data whose text is
    the string or ``#:`` comment after its assignment."""
    return (typing.get_origin(value) is not None
            or isinstance(value, (types.UnionType, typing.TypeVar)))


def _describe(module_name: str, name: str, value: Any) -> str:
    target = f"{module_name}.{name}"
    if _is_type_alias(value):
        return _directive("autodata", target, ":no-value:")
    if inspect.isclass(value):
        kind = "autoexception" if issubclass(value, BaseException) else "autoclass"
        return _directive(kind, target, ":members:", ":undoc-members:")
    if callable(value):
        return _directive("autofunction", target)
    return _directive("autodata", target, ":no-value:")


def api_pages() -> dict[str, str]:
    """Module name -> the MyST page describing its public names."""
    described: dict[int, str] = {}  # id(object) -> where it is described
    pages = {}
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        lines = [f"# `{module_name}`\n", _directive(
            "automodule", module_name, ":no-members:", ":no-index:")]
        submodules, names = [], []
        for name in public_names(module):
            value = getattr(module, name)
            if inspect.ismodule(value):
                if value.__name__.startswith(PACKAGES) and not value.__name__.startswith(
                        LOWERING_TABLES) and not _private(value.__name__):
                    submodules.append(value.__name__)
                continue
            names.append((name, value))
        if submodules:
            lines.append("Submodules: " + ", ".join(
                f"[`{s}`]({s}.md)" for s in sorted(set(submodules))) + ".\n")
        for name, value in names:
            home = _foreign_home(value)
            if home is not None:  # another library's object: its own docs describe it
                lines.append(f"`{name}`\n: `{home}`, re-exported as it is.\n")
                continue
            key = id(value)
            if key in described and _identity_matters(value):
                lines.append(f"`{name}`\n: The same object as {{py:obj}}`{described[key]}`.\n")
                continue
            if _identity_matters(value):
                described[key] = f"{module_name}.{name}"
            lines.append(_describe(module_name, name, value))
        if module_name == "torch_bridge":
            lines.append(_lowered_ops_table())
        pages[module_name] = "\n".join(lines)
    return pages


def _foreign_home(value: Any) -> str | None:
    """``module.qualname`` of a function or class another library defines (torch's
    ``one_hot`` in ``cerebrax.nn.functional``), else None."""
    if not (inspect.isclass(value) or callable(value)) or _is_type_alias(value):
        return None
    module = getattr(value, "__module__", None) or ""
    if module.startswith(PACKAGES) or not module:
        return None
    public = module.split("._")[0] if "._" in module else module
    return f"{public}.{getattr(value, '__qualname__', getattr(value, '__name__', ''))}"


def _private(module_name: str) -> bool:
    return any(part.startswith("_") for part in module_name.split("."))


def _identity_matters(value: Any) -> bool:
    """Functions and classes are the same object wherever they are exported; a constant
    such as an int or a string is described where it appears."""
    return not _is_type_alias(value) and (
        inspect.isclass(value) or callable(value) or inspect.ismodule(value))


def _lowered_ops_table() -> str:
    import torch_bridge

    ops = sorted(map(str, torch_bridge.lowered_ops()))
    rows = "\n".join(f"- `{op}`" for op in ops)
    return (f"## ATen operators with a lowering\n\nThe {len(ops)} overloads "
            "`torch_bridge.lowered_ops()` lists in this build, each lowered to JAX by "
            "one function of `torch_bridge.ops` (`torch_bridge.lowering` adds more):\n\n"
            + rows + "\n")


# ---- the docstring check --------------------------------------------------------------------
def check_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                    lines: list[str]) -> None:
    """Warns (an error under ``-W``) about a public object with no docstring."""
    if what not in CHECKED or name.rsplit(".", 1)[-1].startswith("_"):
        return
    if what == "data" and (inspect.getdoc(type(obj)) == "\n".join(lines).strip()
                           or not any(line.strip() for line in lines)):
        # not the docstring of the constant's type, nor nothing (a typing alias, whose
        # documentation autodoc takes from its type and then drops)
        lines[:] = _constant_doc(name, obj)
    if what in ("method", "property") and not any(line.strip() for line in lines):
        lines[:] = _base_doc(name)  # an override of a documented cerebrax method
    if not any(line.strip() for line in lines):
        logger.warning(f"{name} has no docstring: every public name of cerebrax and "
                       "torch_bridge needs one (write what it does, its arguments and "
                       "what it returns)", type="cerebrax", subtype="docstring")


def _constant_doc(name: str, value: Any) -> list[str]:
    """The ``#:`` comment (or string) at the assignment of a constant that a package
    re-exports: autodoc reads those only in the module the page names."""
    from sphinx.pycode import ModuleAnalyzer

    attr = name.rsplit(".", 1)[-1]
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith(PACKAGES) or getattr(module, attr, None) is not value:
            continue
        try:
            docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
        except Exception:  # noqa: BLE001 - no source (a built-in or extension module)
            continue
        if ("", attr) in docs:
            return list(docs["", attr])
    return []


def _base_doc(name: str) -> list[str]:
    """The docstring of the method ``name`` overrides in a base class of cerebrax or
    torch_bridge (autodoc inherits none: torch's would describe torch, not cerebrax)."""
    from sphinx.util.docstrings import prepare_docstring

    owner_path, attr = name.rsplit(".", 1)
    module_path, class_name = owner_path.rsplit(".", 1)
    owner = getattr(sys.modules.get(module_path), class_name, None)
    for base in getattr(owner, "__mro__", ())[1:]:
        if base.__module__.startswith(PACKAGES) and attr in vars(base):
            member = vars(base)[attr]
            doc = inspect.getdoc(member.fget if isinstance(member, property) else member)
            if doc:
                return prepare_docstring(doc)
    return []


# ---- the generated files --------------------------------------------------------------------
def _write(path: pathlib.Path, text: str) -> None:
    """Writes ``text`` unless the file already holds it (Sphinx rebuilds changed files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate(app: Sphinx) -> None:
    pages = api_pages()
    api_dir = GENERATED / "api"
    for stale in api_dir.glob("*.md") if api_dir.exists() else []:
        if stale.stem not in pages:
            stale.unlink()
    for module_name, text in pages.items():
        _write(api_dir / f"{module_name}.md", text)

    from cerebrax._cli._reference import config_reference_markdown

    _write(GENERATED / "config_keys.md", config_reference_markdown())

    notebooks = GENERATED / "notebooks"
    notebooks.mkdir(parents=True, exist_ok=True)
    for source in sorted((ROOT / "notebooks").glob("*.ipynb")):
        target = notebooks / source.name
        if not target.exists() or target.read_bytes() != source.read_bytes():
            shutil.copyfile(source, target)

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    subprocess.run([sys.executable, str(DOCS / "_ext" / "wafer_figures.py"),
                    str(GENERATED / "figures")], check=True, env=env)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", generate)
    app.connect("autodoc-process-docstring", check_docstring)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
