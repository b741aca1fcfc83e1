"""Runs every tutorial notebook in ``notebooks/`` the way README.md says to run them.

``jupyter nbconvert --to notebook --execute NOTEBOOK --output-dir DIR`` executes each
notebook in a fresh kernel; a cell that raises fails the command and so the test. The
notebooks end with assertions on their own results (accuracy, a falling loss), so a
notebook that runs but trains badly fails here too. The executed copies go to a
temporary folder, and the notebooks write their own files into temporary folders: the
test checks that nothing appears in ``notebooks/``.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("nbconvert", reason="the notebooks extra is not installed")
pytest.importorskip("ipykernel", reason="the notebooks extra is not installed")

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def readme_command() -> str:
    """The notebook command README.md gives, with ``NOTEBOOK`` and ``DIR`` placeholders."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^jupyter nbconvert [^\n]*$", readme, re.MULTILINE)
    assert match, "README.md no longer says how to run the notebooks"
    return match.group(0).split("#")[0].strip()


def test_the_readme_names_every_notebook():
    readme = (ROOT / "README.md").read_text()
    for path in NOTEBOOKS:
        assert path.name in readme, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    command = readme_command()
    assert "notebooks/*.ipynb" in command and "--output-dir" in command, command
    args = command.split()
    args[args.index("notebooks/*.ipynb")] = str(path)
    args[args.index("--output-dir") + 1] = str(tmp_path)
    # The kernel inherits this environment: a multi-device test run may have set
    # XLA_FLAGS to emulate 8 CPU devices, which the single-device notebooks must not see.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    before = sorted(NOTEBOOK_DIR.iterdir())
    args.insert(2, "--ExecutePreprocessor.timeout=600")  # after `jupyter nbconvert`
    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / path.name).exists()
    assert sorted(NOTEBOOK_DIR.iterdir()) == before, "a notebook wrote into notebooks/"
