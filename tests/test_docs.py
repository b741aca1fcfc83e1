"""Every code example of the documentation runs.

- The docstrings' examples (``>>>``) of every module of ``cerebrax`` and ``torch_bridge``
  run as doctests, one test per module, with ``cstorch`` (cerebrax), ``np``, ``jnp``,
  ``jax``, ``optax`` and ``torch`` imported; the process's cerebrax state is reset before each.
- The ``python`` code blocks of each page of the site (``docs/**/*.md``) and of the
  README run in order, as one script per page, in a fresh process in an empty folder.
- The ``yaml`` configs of the command's page pass ``cerebrax validate`` (one step traced).

The site itself (its links, its anchors, a docstring for every public name, the
notebooks) is checked by its build (README, Documentation), which CI runs after the
tests.
"""

from __future__ import annotations

import doctest
import importlib
import os
import pathlib
import pkgutil
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cerebrax as cstorch

# The docstrings run with torch beside cerebrax, and the pages port torch code.
pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PACKAGES = ("cerebrax", "torch_bridge")
FENCE = re.compile(r"^(`{3,})python[ \t]*\n(.*?)^\1[ \t]*$", re.M | re.S)


def modules_with_examples() -> list[str]:
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in [*pkgutil.walk_packages(root.__path__, package + ".")]:
            spec = importlib.util.find_spec(info.name)
            if spec and spec.origin and ">>> " in pathlib.Path(spec.origin).read_text():
                names.append(info.name)
    return sorted(names)


def page_examples(page: pathlib.Path) -> str:
    """The page's ``python`` blocks, one script."""
    return "\n\n".join(textwrap.dedent(m.group(2)) for m in FENCE.finditer(page.read_text()))


PAGES = [ROOT / "README.md"] + sorted(
    p for p in DOCS.rglob("*.md")
    if not any(part.startswith("_") for part in p.relative_to(DOCS).parts)
    and page_examples(p).strip())
# Where torchvision's wheel is a CUDA build beside a CPU torch, its import needs
# tests/torch_bridge/vision.py first (a user's CPU build does not). A page's script
# starts with it.
PREAMBLE = f"""import sys
sys.path.insert(0, {str(ROOT / "tests" / "torch_bridge")!r})
import vision
vision.load()
sys.path.pop(0)
"""


@pytest.mark.parametrize("module_name", modules_with_examples())
def test_docstring_examples_run(module_name: str, tmp_path: pathlib.Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.chdir(tmp_path)  # what the examples write (event files, checkpoints)
    module = importlib.import_module(module_name)
    globs = {"cstorch": cstorch, "np": np, "jnp": jnp, "jax": jax, "optax": optax,
             "torch": torch}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    finder = doctest.DocTestFinder(exclude_empty=True)
    report: list[str] = []
    lowerings = _lowerings()
    for test in finder.find(module, module_name, globs=globs):
        if test.examples:
            cstorch.reset()
            runner.run(test, out=report.append)
    cstorch.reset()
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"{module_name} has '>>> ' but no example was found"
    assert result.failed == 0, "".join(report)
    # An example's lowering replacing a built-in one would stay for every later test of
    # the process, and call into the example's globals, which doctest clears.
    replaced = [str(op) for op, entry in lowerings.items() if _lowerings()[op] is not entry]
    assert not replaced, f"the examples of {module_name} replaced the lowerings of {replaced}"


def _lowerings() -> dict:
    """The bridge's registered lowerings by op, where torch is installed."""
    try:
        from torch_bridge.ops import _registry
    except ImportError:
        return {}
    return dict(_registry._LOWERINGS)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page: pathlib.Path, tmp_path: pathlib.Path) -> None:
    script = tmp_path / f"page_{page.stem}.py"  # not torch.py: it would shadow torch
    examples = page_examples(page)
    needs_vision = any(name in examples for name in ("torchvision", "transformers", "timm"))
    script.write_text((PREAMBLE if needs_vision else "") + examples)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (
        f"the examples of {page.relative_to(ROOT)} failed:\n{done.stdout[-3000:]}\n"
        f"{done.stderr[-5000:]}")


YAML_FENCE = re.compile(r"^```yaml[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
CONFIGS = YAML_FENCE.findall((DOCS / "command.md").read_text())


@pytest.mark.parametrize("config", CONFIGS, ids=[f"config{i}" for i in range(len(CONFIGS))])
def test_command_page_configs_validate(config: str, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the configs name examples/digits.py
    cli = pathlib.Path(sys.executable).with_name("cerebrax")
    done = subprocess.run([str(cli), "validate", str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "validated" in done.stdout + done.stderr


def test_a_failing_example_fails(tmp_path: pathlib.Path) -> None:
    """The doctest runner and the page extraction see a wrong example."""
    test = doctest.DocTestParser().get_doctest(">>> 1 + 1\n3\n", {}, "wrong", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(test, out=lambda _: None)
    assert runner.summarize(verbose=False).failed == 1
    page = "text\n\n```python\nx = 1\n```\n\n```bash\nls\n```\n\n````python\ny = 2\n````\n"
    fake = tmp_path / "page.md"
    fake.write_text(page)
    assert page_examples(fake) == "x = 1\n\n\ny = 2\n"


def test_the_wafer_figures_refuse_a_process_with_one_device(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The figure script needs 8 emulated devices; in a process whose JAX started with
    one it says how to run it instead (tests/multidevice draws the figures)."""
    assert jax.device_count() == 1  # JAX starts here, before the script's import adds
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # its device flag
    spec = importlib.util.spec_from_file_location("wafer_figures_check",
                                                  DOCS / "_ext" / "wafer_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(RuntimeError, match=r"need 8 emulated devices, JAX has 1: run "
                                           r"`python docs/_ext/wafer_figures.py OUT_DIR`"):
        module.write_figures(tmp_path)
    assert not any(tmp_path.iterdir())
