"""tools/modelzoo_names.py on a tiny fake Model Zoo checkout (no Model Zoo, no network).

The script runs in its own interpreter: it turns the cstorch alias on in that process only,
so this one never gets ``cerebras.pytorch`` in ``sys.modules``. The tables are read from
its ``--markdown`` output. The fake checkout uses every import form the script follows:
``import cerebras.pytorch as X``, ``import cerebras.pytorch.distributed as dist``,
``from cerebras.pytorch import amp [as Y]``, ``from cerebras.pytorch.metrics import
AccuracyMetric`` (and ``AccuracyMetric.update``), bare ``import cerebras.pytorch``, an
attribute set, chains cut at a subscript and a call, relative and absolute Model Zoo imports,
and imports that do not run on import (in a function, under ``if TYPE_CHECKING``).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "modelzoo_names.py"
AREAS = ["models", "layers", "common", "data", "trainer", "other"]

FAKE = {
    "__init__.py": "",
    "models/__init__.py": "",
    "models/a/__init__.py": """
        from .model import Model
        from cerebras.modelzoo.data import d
        """,
    "models/a/model.py": """
        import cerebras.pytorch as cstorch
        from cerebras.pytorch.metrics import AccuracyMetric

        from ...trainer import t


        class Model:
            def __init__(self):
                self.dtype = cstorch.amp.get_half_dtype().itemsize
                self.half = cstorch.amp.get_half_dtype
                self.accuracy = AccuracyMetric()
                self.update = AccuracyMetric.update
                self.amp = [cstorch.amp][0].get_half_dtype
                self.trainer = t
                cstorch.no_such_thing.x(1)
        """,
    "data/__init__.py": "",
    "data/d.py": """
        import cerebras.pytorch.distributed as dist
        from cerebras.pytorch import amp


        def rank():
            return dist.is_streamer(), amp.get_half_dtype(), dist.no_such_rank
        """,
    "layers/l.py": """
        from cerebras.pytorch import amp as cs_amp

        HALF = cs_amp.get_half_dtype
        NOPE = cs_amp.no_such_amp_name
        """,
    "common/c.py": """
        import cerebras.pytorch as cstorch

        cstorch.amp.some_flag = True
        """,
    "cli/c.py": """
        import cerebras.appliance as appliance

        appliance.no_such_appliance_module.other()
        """,
    "trainer/__init__.py": "",
    "trainer/t.py": """
        from typing import TYPE_CHECKING

        import cerebras.pytorch
        from cerebras.appliance.no_such_appliance_module import Thing
        from cerebras.pytorch.no_such_module import thing

        from . import helper

        if TYPE_CHECKING:
            from . import typing_only


        def train(loader: cerebras.pytorch.utils.data.DataLoader):
            from . import lazy

            return thing.Config, Thing, helper, lazy
        """,
    "trainer/helper.py": """
        import cerebras.pytorch as cstorch

        LOADER = cstorch.utils.data.DataLoader
        """,
    "trainer/typing_only.py": """
        import cerebras.pytorch as cstorch

        X = cstorch.typing_name_missing
        """,
    "trainer/lazy.py": """
        import cerebras.pytorch as cstorch

        X = cstorch.lazy_name_missing
        """,
}

# name: uses, files, resolves, uses per area (AREAS order)
EXPECTED = {
    "amp": ("4", "4", "yes", "1 1 1 1 0 0"),
    "amp.get_half_dtype": ("4", "3", "yes", "2 1 0 1 0 0"),
    "metrics.AccuracyMetric": ("2", "1", "yes", "2 0 0 0 0 0"),
    "utils.data.DataLoader": ("2", "2", "yes", "0 0 0 0 2 0"),
    "amp.no_such_amp_name": ("1", "1", "no: no name amp.no_such_amp_name", "0 1 0 0 0 0"),
    "distributed": ("1", "1", "yes", "0 0 0 1 0 0"),
    "distributed.is_streamer": ("1", "1", "yes", "0 0 0 1 0 0"),
    "distributed.no_such_rank": ("1", "1", "no: no name distributed.no_such_rank",
                                 "0 0 0 1 0 0"),
    "lazy_name_missing": ("1", "1", "no: no name lazy_name_missing", "0 0 0 0 1 0"),
    "metrics.AccuracyMetric.update": ("1", "1", "yes", "1 0 0 0 0 0"),
    "no_such_module.thing": ("1", "1", "no: no module no_such_module", "0 0 0 0 1 0"),
    "no_such_module.thing.Config": ("1", "1", "no: no module no_such_module", "0 0 0 0 1 0"),
    "no_such_thing.x": ("1", "1", "no: no module no_such_thing", "1 0 0 0 0 0"),
    "typing_name_missing": ("1", "1", "no: no name typing_name_missing", "0 0 0 0 1 0"),
}

# area: uses resolved, uses, %, names resolved, names
EXPECTED_AREAS = {
    "models": "6 7 85.7% 4 5",
    "layers": "2 3 66.7% 2 3",
    "common": "1 1 100.0% 1 1",
    "data": "4 5 80.0% 4 5",
    "trainer": "2 6 33.3% 1 5",
    "other": "0 0 - 0 0",
    "all": "15 22 68.2% 7 14",
}


def _checkout(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    package = root / "src" / "cerebras" / "modelzoo"
    for rel, text in files.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


def _run(*args) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": path})


def _tables(markdown: str) -> list[list[list[str]]]:
    """The markdown tables of the output, each a list of rows of cells (header first)."""
    tables: list[list[list[str]]] = []
    in_table = False
    for line in markdown.splitlines():
        if not line.startswith("|"):
            in_table = False
        elif not set(line) <= set("|-:"):  # not the |---|---:| line
            if not in_table:
                tables.append([])
                in_table = True
            tables[-1].append([c.strip() for c in line.strip("|").split(" | ")])
    return tables


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> pathlib.Path:
    return _checkout(tmp_path_factory.mktemp("mz"), FAKE)


@pytest.fixture(scope="module")
def report(fake) -> subprocess.CompletedProcess:
    return _run(fake, "--markdown")


def test_names_table(report):
    assert report.returncode == 0, report.stderr
    names = _tables(report.stdout)[0]
    assert names[0] == ["name", "uses", "files", "resolves", *AREAS]
    assert [row[0] for row in names[1:]] == list(EXPECTED)  # by uses, then name
    got = {row[0]: (*row[1:4], " ".join(row[4:])) for row in names[1:]}
    assert got == EXPECTED
    assert "## cerebras.pytorch names: 14 names, 22 uses" in report.stdout


def test_area_summary(report):
    areas = _tables(report.stdout)[1]
    assert areas[0] == ["area", "uses resolved", "uses", "%", "names resolved", "names"]
    assert {row[0]: " ".join(row[1:]) for row in areas[1:]} == EXPECTED_AREAS


def test_appliance_table(report):
    names, areas = _tables(report.stdout)[2:4]
    got = {row[0]: (row[1], row[2], " ".join(row[4:])) for row in names[1:]}
    assert got == {"no_such_appliance_module.Thing": ("2", "1", "0 0 0 0 2 0"),
                   "no_such_appliance_module.other": ("1", "1", "0 0 0 0 0 1")}
    assert all(row[3].startswith("no: no module") for row in names[1:])
    assert {row[0]: " ".join(row[1:]) for row in areas[1:]}["all"] == "0 3 0.0% 0 2"


def test_trainer_import_chain(report):
    out = report.stdout
    assert "## import chain of the models/ modules: 9 modules" in out
    assert ("trainer import chain: 3 names, 1 resolved (the 3 trainer/ ones of its modules)\n"
            "- unresolved: no_such_module.thing (no module no_such_module)\n"
            "- unresolved: no_such_module.thing.Config (no module no_such_module)\n") in out
    # data/d.py is in the chain (models/a/__init__.py imports it); layers/l.py, common/c.py
    # and the trainer modules imported lazily or only for type checking are not.
    assert ("whole import chain: 11 names, 7 resolved (all of its modules)\n"
            "- unresolved: distributed.no_such_rank (no name distributed.no_such_rank)\n"
            "- unresolved: no_such_module.thing (no module no_such_module)\n"
            "- unresolved: no_such_module.thing.Config (no module no_such_module)\n"
            "- unresolved: no_such_thing.x (no module no_such_thing)\n") in out
    assert "trainer import chain, cerebras.appliance: 1 names, 0 resolved" in out
    assert "cerebras.pytorch" not in sys.modules and "cerebras.appliance" not in sys.modules


def test_plain_table_and_package_folder(fake):
    out = _run(fake / "src" / "cerebras" / "modelzoo").stdout
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("name "))
    assert header.split() == ["name", "uses", "files", "resolves", *AREAS]
    row = next(line for line in lines if line.startswith("no_such_thing.x "))
    assert row.split() == ["no_such_thing.x", "1", "1", "no:", "no", "module", "no_such_thing",
                           "1", "0", "0", "0", "0", "0"]
    assert row.index("no:") == header.index("resolves")  # aligned columns
    assert "trainer import chain: 3 names, 1 resolved" in out


def test_area_and_missing_filters(fake):
    names = _tables(_run(fake, "--markdown", "--area", "data", "--missing").stdout)[0]
    assert names == [["name", "uses", "files", "resolves", "data"],
                     ["distributed.no_such_rank", "1", "1",
                      "no: no name distributed.no_such_rank", "1"]]


def test_check_fails_on_the_fake(report, fake):
    result = _run(fake, "--check")
    assert result.returncode == 1
    assert "check failed: models: 6/7 uses resolve, under 98%" in result.stderr
    assert "check failed: data: 4/5 uses resolve, under 98%" in result.stderr
    assert "check failed: trainer import chain: 2 names unresolved" in result.stderr
    assert report.returncode == 0  # without --check: 0


CLEAN = {
    "__init__.py": "",
    "models/m.py": """
        import cerebras.pytorch as cstorch
        from cerebras.modelzoo.trainer import t

        X = cstorch.amp.get_half_dtype
        """,
    "layers/l.py": "import cerebras.pytorch as cstorch\nX = cstorch.no_such_layer_name\n",
    "trainer/__init__.py": "",
    "trainer/t.py": "import cerebras.pytorch as cstorch\nL = cstorch.utils.data.DataLoader\n",
    "trainer/off.py": "import cerebras.pytorch as cstorch\nX = cstorch.no_such_off_name\n",
}


@pytest.mark.parametrize("change, failure", [
    ({}, None),
    # 49 of 50 uses in data/ resolve: 98%, not below it.
    ({"data/d.py": "import cerebras.pytorch as c\n" + "c.amp.get_half_dtype\n" * 49
                   + "c.no_such_data_name\n"}, None),
    ({"data/d.py": "import cerebras.pytorch as c\n" + "c.amp.get_half_dtype\n" * 48
                   + "c.no_such_data_name\n"}, "data: 48/49 uses resolve, under 98%"),
    ({"trainer/t.py": CLEAN["trainer/t.py"] + "Y = cstorch.no_such_chain_name\n"},
     "trainer import chain: 1 names unresolved"),
])
def test_check_exit_status(tmp_path, change, failure):
    result = _run(_checkout(tmp_path, {**CLEAN, **change}), "--check")
    assert result.returncode == (1 if failure else 0), result.stderr
    assert (f"check failed: {failure}" in result.stderr) if failure else (
        "check failed" not in result.stderr)


@pytest.mark.parametrize("where", ["nowhere", "empty"])
def test_bad_checkout(tmp_path, where):
    (tmp_path / "empty").mkdir()
    result = _run(tmp_path / where)
    assert result.returncode == 2
    assert (f"error: {tmp_path / where} is neither a Model Zoo checkout (holding "
            "src/cerebras/modelzoo) nor its modelzoo package folder") in result.stderr
    assert result.stdout == ""
