"""Which cstorch names Cerebras' Model Zoo uses, and whether cerebrax resolves each one.

Reads every .py file of a Model Zoo checkout with :mod:`ast` (Model Zoo is never imported),
collects the ``cerebras.pytorch`` names its code uses (and, in a second table, the
``cerebras.appliance`` ones), looks each one up with cerebrax's cstorch alias enabled in this
process, and prints:

- a table: name (relative to ``cerebras.pytorch``), uses, files, whether it resolves (else the
  first missing piece), uses per area (the first folder under modelzoo/: models, layers,
  common, data, trainer; "other" for the rest), sorted by uses, then name;
- per area: uses resolved / uses, and names resolved / names;
- the trainer import chain: the Model Zoo modules that importing every module under models/
  imports (statically: module-level import statements, followed transitively, with the
  ``__init__.py`` of every parent package), and the names that the ones under trainer/ (and
  the whole chain) use.

A use is one occurrence in the source: an import statement naming it (``from
cerebras.pytorch.metrics import AccuracyMetric`` uses ``metrics.AccuracyMetric``) or a
reference through a name bound by such an import (``cstorch.amp.get_half_dtype()`` uses
``amp.get_half_dtype``; ``dist.get_rank`` after ``import cerebras.pytorch.distributed as dist``
uses ``distributed.get_rank``). A reference takes its longest attribute chain (stopping at
calls and subscripts; an attribute assigned or deleted names the object holding it). Bound
names are per file, not per scope.

Run (CHECKOUT: the Model Zoo repository root, or its src/cerebras/modelzoo folder):

    python tools/modelzoo_names.py CHECKOUT [--markdown] [--area AREA ...] [--missing] [--check]

Exit status 0; 2 for a bad command line; with --check, 1 where under models/ or data/ less
than MIN_RESOLVED_SHARE of the uses resolve, or a trainer import chain name does not.
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import functools
import importlib
import itertools
import pathlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from types import ModuleType

MIN_RESOLVED_SHARE = 0.98  # --check: the share of uses that resolve, in each CHECKED_AREAS
CHECKED_AREAS = ("models", "data")
AREAS = ("models", "layers", "common", "data", "trainer", "other")
ROOTS = ("cerebras.pytorch", "cerebras.appliance")
PACKAGE = "cerebras.modelzoo"


@dataclasses.dataclass
class FileScan:
    """What one Model Zoo file uses and imports."""

    path: str  # relative to the modelzoo folder
    module: str  # cerebras.modelzoo.x.y
    area: str
    uses: list[tuple[str, str]]  # (root, name relative to it), one per occurrence
    imports: set[str]  # dotted names its module-level imports name (modules or not)


@dataclasses.dataclass
class NameRow:
    """One name: its uses per area, the files using it, and the first missing piece."""

    uses: collections.Counter[str]
    files: set[str]
    missing: str | None = None


def find_package(checkout: pathlib.Path) -> pathlib.Path | None:
    """The modelzoo package folder of CHECKOUT (a repository root or the folder itself)."""
    for folder in (checkout / "src" / "cerebras" / "modelzoo", checkout):
        if (folder / "__init__.py").is_file() and (folder / "models").is_dir():
            return folder
    return None


def area_of(rel: pathlib.Path) -> str:
    first = rel.parts[0] if len(rel.parts) > 1 else ""
    return first if first in AREAS[:-1] else "other"


def module_of(rel: pathlib.Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def split_root(full: str) -> tuple[str, str] | None:
    """("cerebras.pytorch", "amp.x") for "cerebras.pytorch.amp.x"; None outside ROOTS."""
    for root in ROOTS:
        if full.startswith(root + "."):
            return root, full[len(root) + 1:]
    return None


def _imported(node: ast.Import | ast.ImportFrom, here: str,
              is_package: bool) -> Iterator[tuple[str, str, str]]:
    """(bound name, dotted name bound to it, dotted name the statement imports) per alias."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            first = alias.name.split(".")[0]
            yield alias.asname or first, alias.name if alias.asname else first, alias.name
        return
    parts = here.split(".")  # a relative import counts from the module's package
    base = parts[: len(parts) + is_package - node.level] if node.level else []
    module = ".".join(base + ([node.module] if node.module else []))
    for alias in node.names:
        if alias.name != "*":
            full = f"{module}.{alias.name}"
            yield alias.asname or alias.name, full, full


def runtime_imports(body: Iterable[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements run on import: none in functions or under ``if TYPE_CHECKING``."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from runtime_imports(node.orelse)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from runtime_imports(getattr(node, field, None) or [])


class _References(ast.NodeVisitor):
    """Collects the dotted names that references through the bound names spell."""

    def __init__(self, bound: dict[str, str]) -> None:
        self.bound = bound
        self.found: list[str] = []

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id in self.bound:
            self.found.append(self.bound[node.id])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain, base = [], node
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if not isinstance(base, ast.Name):
            self.visit(base)  # a call or subscript: a chain may start inside it
        elif base.id in self.bound:
            chain.reverse()
            if not isinstance(node.ctx, ast.Load):
                chain.pop()
            self.found.append(".".join([self.bound[base.id], *chain]))


def scan_file(path: pathlib.Path, rel: pathlib.Path) -> FileScan:
    tree = ast.parse(path.read_bytes(), filename=str(path))
    here, is_package = module_of(rel), rel.name == "__init__.py"
    bound: dict[str, str] = {}
    named: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name, target, full in _imported(node, here, is_package):
                if target == "cerebras" or split_root(target + "."):
                    bound[name] = target
                named.append(full)
    refs = _References(bound)
    refs.visit(tree)
    uses = [s for s in map(split_root, named + refs.found) if s is not None]
    imports = {full for node in runtime_imports(tree.body)
               for _, _, full in _imported(node, here, is_package)}
    return FileScan(rel.as_posix(), here, area_of(rel), uses, imports)


def scan(package: pathlib.Path) -> list[FileScan]:
    scans = []
    for path in sorted(package.rglob("*.py")):
        try:
            scans.append(scan_file(path, path.relative_to(package)))
        except (SyntaxError, ValueError) as e:
            print(f"skipped {path}: {e}", file=sys.stderr)
    return scans


@functools.lru_cache(maxsize=None)
def resolve(root: str, name: str) -> str | None:
    """None when ``root.name`` resolves with the alias on; else its first missing piece."""
    parts, depth = f"{root}.{name}".split("."), len(root.split("."))
    for cut in range(len(parts), depth - 1, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
            break
        except ModuleNotFoundError as e:
            if e.name and (module == e.name or module.startswith(e.name + ".")):
                continue
            return f"import of {module} fails: {e}"
        except Exception as e:  # a module that exists but fails to import
            return f"import of {module} fails: {type(e).__name__}: {e}"
    else:
        return f"no module {root}"
    for i in range(cut, len(parts)):
        try:
            obj = getattr(obj, parts[i])
        except Exception:  # a lower-case namespace in a module: a missing submodule
            inner = i < len(parts) - 1 and parts[i].islower() and isinstance(obj, ModuleType)
            return f"no {'module' if inner else 'name'} {'.'.join(parts[depth:i + 1])}"
    return None


def name_rows(scans: Iterable[FileScan], root: str,
              areas: Sequence[str] = AREAS) -> dict[str, NameRow]:
    rows: dict[str, NameRow] = {}
    for s in scans:
        if s.area in areas:
            for r, name in s.uses:
                if r == root:
                    row = rows.setdefault(name, NameRow(collections.Counter(), set()))
                    row.uses[s.area] += 1
                    row.files.add(s.path)
    for name, row in rows.items():
        row.missing = resolve(root, name)
    return rows


def area_summary(rows: dict[str, NameRow], area: str | None) -> tuple[int, int, int, int]:
    """(uses resolved, uses, names resolved, names) in one area (None: all areas)."""
    counts = [(sum(r.uses.values()) if area is None else r.uses[area], r.missing is None)
              for r in rows.values()]
    counts = [(n, ok) for n, ok in counts if n]
    return (sum(n for n, ok in counts if ok), sum(n for n, _ in counts),
            sum(ok for _, ok in counts), len(counts))


def import_chain(scans: list[FileScan]) -> list[FileScan]:
    """The scans of the modules that importing every module under models/ imports."""
    by_module = {s.module: s for s in scans}

    def modules(dotted: str) -> Iterator[str]:  # dotted and its parents that are modules
        parts = dotted.split(".")
        return (m for i in range(1, len(parts) + 1)
                if (m := ".".join(parts[:i])) in by_module)

    todo = [m for s in scans if s.area == "models" for m in modules(s.module)]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(m for full in by_module[module].imports for m in modules(full))
    return [by_module[m] for m in sorted(seen)]


def render(headers: Sequence[str], rows: list[list[str]], markdown: bool) -> str:
    right = [all(c.rstrip("%").replace(".", "").isdigit() or c in ("-", "")
                 for c in col) for col in zip(*rows)] if rows else [False] * len(headers)
    if markdown:
        lines = ["| " + " | ".join(headers) + " |",
                 "|" + "|".join("---:" if r else "---" for r in right) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(map(len, col)) for col in zip(headers, *rows)]
    return "\n".join("  ".join(c.rjust(w) if r else c.ljust(w)
                               for c, w, r in zip(row, widths, right)).rstrip()
                     for row in [list(headers), *rows])


def names_table(rows: dict[str, NameRow], areas: Sequence[str], missing_only: bool,
                markdown: bool) -> str:
    order = sorted(rows.items(), key=lambda kv: (-sum(kv[1].uses.values()), kv[0]))
    body = [[name, str(sum(r.uses.values())), str(len(r.files)),
             "yes" if r.missing is None else f"no: {r.missing}",
             *(str(r.uses[a]) for a in areas)]
            for name, r in order if not (missing_only and r.missing is None)]
    return render(["name", "uses", "files", "resolves", *areas], body, markdown)


def summary_table(rows: dict[str, NameRow], areas: Sequence[str], markdown: bool) -> str:
    body = []
    for area in [*areas, None]:
        ok, uses, names_ok, names = area_summary(rows, area)
        share = f"{100 * ok / uses:.1f}%" if uses else "-"
        body.append([area or "all", str(ok), str(uses), share, str(names_ok), str(names)])
    return render(["area", "uses resolved", "uses", "%", "names resolved", "names"], body,
                  markdown)


def chain_report(chain: list[FileScan], root: str, trainer_only: bool) -> tuple[str, list[str]]:
    """The chain's line ("N names, M resolved") and its unresolved names."""
    picked = [s for s in chain if s.area == "trainer" or not trainer_only]
    rows = name_rows(picked, root)
    bad = sorted(f"{n} ({r.missing})" for n, r in rows.items() if r.missing is not None)
    where = f"the {len(picked)} trainer/ ones" if trainer_only else "all"
    return f"{len(rows)} names, {len(rows) - len(bad)} resolved ({where} of its modules)", bad


def check_failures(scans: list[FileScan], trainer_unresolved: list[str]) -> list[str]:
    rows = name_rows(scans, ROOTS[0])
    failures = []
    for area in CHECKED_AREAS:
        ok, uses = area_summary(rows, area)[:2]
        if uses and ok / uses < MIN_RESOLVED_SHARE:
            failures.append(f"{area}: {ok}/{uses} uses resolve, under {MIN_RESOLVED_SHARE:.0%}")
    if trainer_unresolved:
        failures.append(f"trainer import chain: {len(trainer_unresolved)} names unresolved")
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=pathlib.Path,
                        help="Model Zoo repository root, or its src/cerebras/modelzoo folder")
    parser.add_argument("--markdown", action="store_true", help="markdown tables")
    parser.add_argument("--area", nargs="+", choices=AREAS, default=list(AREAS),
                        help="list only these areas' uses (the chain and --check: all)")
    parser.add_argument("--missing", action="store_true", help="list unresolved names only")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 where models/ or data/ resolve too few uses, or a "
                             "trainer import chain name does not resolve")
    args = parser.parse_args(argv)
    package = find_package(args.checkout)
    if package is None:
        parser.error(f"{args.checkout} is neither a Model Zoo checkout (holding "
                     "src/cerebras/modelzoo) nor its modelzoo package folder")
    import cerebrax  # only now: --help and usage errors need no JAX

    cerebrax.enable_cstorch_alias()
    scans = scan(package)
    head = "## " if args.markdown else ""
    print(f"{head}Model Zoo at {package}: {len(scans)} files")
    for root in ROOTS:
        rows = name_rows(scans, root, args.area)
        print(f"\n{head}{root} names: {len(rows)} names, "
              f"{sum(sum(r.uses.values()) for r in rows.values())} uses\n")
        print(names_table(rows, args.area, args.missing, args.markdown))
        print(f"\n{head}{root} per area\n")
        print(summary_table(rows, args.area, args.markdown))
    chain = import_chain(scans)
    print(f"\n{head}import chain of the models/ modules: {len(chain)} modules")
    trainer_bad: list[str] = []
    for root, (label, trainer_only) in itertools.product(
            ROOTS, [("trainer import chain", True), ("whole import chain", False)]):
        line, bad = chain_report(chain, root, trainer_only)
        trainer_bad += bad if root == ROOTS[0] and trainer_only else []
        print(f"\n{label}{'' if root == ROOTS[0] else ', ' + root}: {line}")
        print("".join(f"{'-' if args.markdown else ' '} unresolved: {b}\n" for b in bad), end="")
    failures = check_failures(scans, trainer_bad) if args.check else []
    for failure in failures:
        print(f"check failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
