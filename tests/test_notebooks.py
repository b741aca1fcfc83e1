"""Executes every tutorial notebook in ``notebooks/``; a cell that raises fails the test.

The notebooks end with assertions on their own results (accuracy, a falling loss), so a
notebook that runs but trains badly fails here too. Each runs in a fresh kernel with the
working directory set to a temporary folder, so nothing is written into the repository.
"""

from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("ipykernel", reason="the notebooks extra is not installed")
nbclient = pytest.importorskip("nbclient", reason="the notebooks extra is not installed")
nbformat = pytest.importorskip("nbformat", reason="the notebooks extra is not installed")

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: pathlib.Path, tmp_path: pathlib.Path, monkeypatch) -> None:
    # The kernel inherits this process's environment: a multi-device test run may have
    # set XLA_FLAGS to emulate 8 CPU devices, which the single-device notebooks must
    # not see.
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    assert list(tmp_path.iterdir()) == [], "a notebook wrote files into its working folder"
