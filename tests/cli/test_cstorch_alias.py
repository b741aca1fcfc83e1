"""``import cerebras.pytorch as cstorch`` is cerebrax: the same module objects, never a copy.

``cerebras/`` (no ``__init__.py``: a PEP 420 namespace portion) holds
``cerebras/pytorch/__init__.py``, which replaces itself with :mod:`cerebrax` in
``sys.modules`` and maps every ``cerebras.pytorch.X`` to the module ``cerebrax.X`` (see its
docstring). These tests check that the names a cstorch script imports resolve to cerebrax's
own objects, that a second ``cerebras`` portion (Cerebras' Model Zoo, ``cerebras.modelzoo``)
imports next to it in either order, that DataLoader workers (spawn, forkserver) that
re-import a data module using ``cerebras.pytorch.distributed`` work, and that a training
script with the cstorch import line gives the losses of the same script importing cerebrax.

The in-process tests import the alias once (module fixture) and undo it afterwards; the
others run their own interpreter, so this process's ``sys.modules`` stays as it was.
"""

from __future__ import annotations

import collections
import importlib
import importlib.util
import inspect
import json
import os
import pathlib
import subprocess
import sys

import pytest

import cerebrax

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Where cerebrax keeps the cerebras.pytorch alias; only `cerebrax run` and
# cerebrax.enable_cstorch_alias() put it on the path.
ALIAS = pathlib.Path(cerebrax.__file__).resolve().parent / "_alias"
_MISSING = object()


def _is_alias_finder(finder) -> bool:
    return bool(getattr(finder, "_cerebras_pytorch_alias", False))


@pytest.fixture(scope="module")
def cstorch():
    """``import cerebras.pytorch as cstorch`` in this process, undone after the module's tests."""
    added_path = str(ALIAS) not in sys.path
    if added_path:
        sys.path.insert(0, str(ALIAS))
    had_finder = any(_is_alias_finder(f) for f in sys.meta_path)
    before = set(sys.modules)
    import cerebras.pytorch as alias  # noqa: PLC0415

    yield alias
    for name in [n for n in sys.modules if n.split(".")[0] == "cerebras" and n not in before]:
        del sys.modules[name]
    if not had_finder:
        sys.meta_path[:] = [f for f in sys.meta_path if not _is_alias_finder(f)]
    if added_path:
        sys.path.remove(str(ALIAS))


def _cerebrax_modules() -> list[str]:
    """Every module of the cerebrax package, as a name relative to it (``__main__``s left out:
    importing them runs the command line)."""
    names = []
    for path in sorted((ROOT / "cerebrax").rglob("*.py")):
        parts = list(path.relative_to(ROOT / "cerebrax").with_suffix("").parts)
        if parts[-1] == "__main__" or parts[0] == "_alias":  # _alias: the alias itself
            continue
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            names.append(".".join(parts))
    return names


def _no_second_copy(modules: dict) -> list[str]:
    """The source files that more than one module object in ``modules`` was loaded from."""
    by_file = collections.defaultdict(set)
    for module in list(modules.values()):
        file = getattr(module, "__file__", None)
        if file and "cerebrax" in file and os.path.realpath(file).startswith(
                str(ROOT / "cerebrax") + os.sep):
            by_file[os.path.realpath(file)].add(id(module))
    return sorted(f for f, ids in by_file.items() if len(ids) > 1)


def _env(*first: pathlib.Path) -> dict[str, str]:
    """The environment of a child interpreter: ``first`` and then this checkout on its path
    (the checkout's ``cerebras/`` is found there whether or not pip installed it)."""
    env = dict(os.environ)
    parts = [*map(str, first), str(ALIAS), str(ROOT)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _plain_env() -> dict[str, str]:
    """A child's environment with this checkout on its path and no alias."""
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ALIAS)]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *parts])
    return env


def _run(script: pathlib.Path, *args: str, env: dict[str, str], timeout: float = 120):
    return subprocess.run([sys.executable, str(script), *args], cwd=script.parent, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _last_json(proc) -> dict:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- in process


def test_cerebras_pytorch_is_the_cerebrax_module(cstorch):
    import cerebras  # noqa: PLC0415

    assert cstorch is cerebrax
    assert sys.modules["cerebras.pytorch"] is cerebrax
    assert cerebras.pytorch is cerebrax
    # cerebras stays a namespace package: no __init__.py here, no file, an open path.
    assert not (ALIAS / "cerebras" / "__init__.py").exists()
    assert getattr(cerebras, "__file__", None) is None
    assert str(ALIAS / "cerebras") in list(cerebras.__path__)


@pytest.mark.parametrize("name", _cerebrax_modules())
def test_every_cerebrax_module_is_its_own_alias(cstorch, name):
    """``cerebras.pytorch.X`` is the module object ``cerebrax.X``, with cerebrax's own name and
    spec; importing it leaves its parent's attribute as it was (``cerebrax.trace`` stays the
    function), and no file is loaded twice."""
    if importlib.util.find_spec("torch") is None:
        try:
            importlib.import_module(f"cerebrax.{name}")
        except ModuleNotFoundError as error:
            if error.name != "torch":
                raise
            pytest.skip(f"cerebrax.{name} is a torch module, and torch is not installed")
    parent, _, child = name.rpartition(".")
    parent_module = importlib.import_module(f"cerebrax.{parent}" if parent else "cerebrax")
    before = parent_module.__dict__.get(child, _MISSING)
    aliased = importlib.import_module(f"cerebras.pytorch.{name}")
    real = importlib.import_module(f"cerebrax.{name}")
    assert aliased is real
    assert sys.modules[f"cerebras.pytorch.{name}"] is real
    assert real.__name__ == real.__spec__.name == f"cerebrax.{name}"
    assert parent_module.__dict__[child] is (real if before is _MISSING else before)
    assert _no_second_copy(sys.modules) == []


# (import statement, the name it binds, what that must be: a path in cerebrax)
IMPORT_FORMS = [
    ("import cerebras.pytorch as cstorch", "cstorch", ""),
    ("import cerebras.pytorch.distributed as dist", "dist", "distributed"),
    ("from cerebras.pytorch.utils.tensorboard import SummaryWriter", "SummaryWriter",
     "summaries.SummaryWriter"),
    ("from cerebras.pytorch.metrics import AccuracyMetric", "AccuracyMetric",
     "metrics.AccuracyMetric"),
    ("import cerebras.pytorch.amp", "cerebras", None),  # checked below: cerebras.pytorch.amp
    ("from cerebras.pytorch import optim", "optim", "optim"),
    ("from cerebras.pytorch import distributed as dist", "dist", "distributed"),
    ("import cerebras.pytorch.optim.lr_scheduler as lrs", "lrs", "optim.lr_scheduler"),
    ("from cerebras.pytorch.optim.lr_scheduler import CosineDecayLR", "CosineDecayLR",
     "optim.lr_scheduler.CosineDecayLR"),
    ("from cerebras.pytorch.utils.data import DataLoader", "DataLoader", "data.DataLoader"),
    ("import cerebras.pytorch.utils.data as data", "data", "utils.data"),
    ("from cerebras.pytorch.distributed import get_worker_state", "get_worker_state",
     "data._streamers.get_worker_state"),
]


@pytest.mark.parametrize("statement, bound, expected", IMPORT_FORMS,
                         ids=[s for s, _, _ in IMPORT_FORMS])
def test_import_statements_bind_cerebraxs_objects(cstorch, statement, bound, expected):
    namespace: dict = {}
    exec(statement, namespace)  # noqa: S102
    value = namespace[bound]
    if expected is None:  # `import cerebras.pytorch.amp` binds the namespace package
        assert value.pytorch is cerebrax and value.pytorch.amp is cerebrax.amp
        return
    target = cerebrax
    for part in filter(None, expected.split(".")):
        target = getattr(target, part)
    assert value is target


# The names of a cstorch script (README, seed scripts) and the cerebras.pytorch.distributed
# and utils names Model Zoo uses that cerebrax has (shared/research/modelzoo_cstorch_names.md).
KEY_NAMES = [
    "compile", "trace", "backend", "step_closure", "checkpoint_closure", "save", "load",
    "reset", "optim.SGD", "optim.AdamW", "optim.lr_scheduler.CosineDecayLR",
    "amp.GradScaler", "metrics.AccuracyMetric", "utils.data.DataLoader",
    "utils.data.DataExecutor", "utils.data.DistributedSampler",
    "utils.tensorboard.SummaryWriter", "distributed.ClusterConfig", "distributed.is_streamer",
    "distributed.num_streamers", "distributed.get_streaming_rank",
    "distributed.get_worker_state", "distributed.is_master_ordinal", "distributed.get_ordinal",
    "distributed.num_tasks", "distributed.get_streaming_batch_size",
    "distributed.num_receivers", "distributed.initialize", "distributed.shutdown",
]


@pytest.mark.parametrize("name", KEY_NAMES)
def test_key_names_resolve_to_cerebraxs_objects(cstorch, name):
    """``cerebras.pytorch.<module>.<attr>``, the module imported through the alias, is
    ``cerebrax.<module>.<attr>``."""
    module, _, attr = name.rpartition(".")
    aliased = importlib.import_module(".".join(filter(None, ["cerebras.pytorch", module])))
    real = importlib.import_module(".".join(filter(None, ["cerebrax", module])))
    assert hasattr(real, attr), f"cerebrax lacks {name}"
    assert getattr(aliased, attr) is getattr(real, attr)


def test_a_missing_submodule_is_not_found(cstorch):
    before = set(sys.modules)
    with pytest.raises(ModuleNotFoundError) as raised:
        importlib.import_module("cerebras.pytorch.no_such_module")
    assert raised.value.name == "cerebras.pytorch.no_such_module"
    with pytest.raises(ModuleNotFoundError, match="is not a package"):
        importlib.import_module("cerebras.pytorch.utils.tracker.x")  # tracker is a module
    assert set(sys.modules) == before


# ------------------------------------------------------------------------- own interpreter

_FRESH = """
import collections, importlib, json, os, pathlib, sys
import cerebras.pytorch.cli as cli_alias              # before anything imported cerebrax
assert "cerebrax.cli" in sys.modules
import cerebrax.cli
import cerebrax.summaries._loader as loader            # the other way round
import cerebras.pytorch.summaries._loader as loader_alias
import cerebrax
ROOT = pathlib.Path(sys.argv[1])
NAMES = json.loads(sys.argv[2])
NO_SECOND_COPY
for name in NAMES:                                     # cerebrax's names first, then the alias
    importlib.import_module("cerebrax." + name)
def attributes():
    return {(m, k): id(v) for m, mod in list(sys.modules.items()) if m.startswith("cerebrax")
            for k, v in list(vars(mod).items())}
before = attributes()
for name in NAMES:
    importlib.import_module("cerebras.pytorch." + name)
import cerebras.pytorch.trace, cerebras.pytorch.backend
from cerebras.pytorch.backend import Backend
from cerebras.pytorch.utils.tensorboard import SummaryWriter
after = attributes()
print(json.dumps({
    "cli": cli_alias is cerebrax.cli, "loader": loader_alias is loader,
    "writer": SummaryWriter is cerebrax.summaries.SummaryWriter,
    "names": [cli_alias.__name__, loader_alias.__spec__.name],
    "changed": sorted(".".join(k) for k in set(before) | set(after)
                      if before.get(k) != after.get(k)),
    "trace": type(cerebrax.trace).__name__, "backend": type(cerebrax.backend).__name__,
    "copies": _no_second_copy(sys.modules)}))
"""


def test_a_fresh_process_shares_every_module_and_changes_no_attribute(tmp_path):
    """In a new interpreter whose first import is ``cerebras.pytorch.cli``, modules that
    ``import cerebrax`` does not load come out once, under cerebrax's names. Then every
    cerebrax module is imported by its own name, and then through the alias: that changes no
    attribute of any cerebrax module (``cerebrax.trace`` and ``cerebrax.backend`` stay
    functions, though submodules of the same names exist)."""
    pytest.importorskip("torch")  # some of cerebrax's modules are torch modules
    script = tmp_path / "fresh.py"
    script.write_text(_FRESH.replace("NO_SECOND_COPY", inspect.getsource(_no_second_copy)))
    names = json.dumps(_cerebrax_modules())
    result = _last_json(_run(script, str(ROOT), names, env=_env()))
    assert result == {"cli": True, "loader": True, "writer": True,
                      "names": ["cerebrax.cli", "cerebrax.summaries._loader"], "changed": [],
                      "trace": "function", "backend": "function", "copies": []}


_ZOO = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
import cerebras, cerebras.modelzoo, cerebrax
import cerebras.pytorch as cstorch
print(json.dumps({
    "zoo": cerebras.modelzoo.NAME, "zoo_cstorch": cerebras.modelzoo.cstorch is cerebrax,
    "zoo_dist": cerebras.modelzoo.dist is cerebrax.distributed, "cstorch": cstorch is cerebrax,
    "file": getattr(cerebras, "__file__", None), "path": list(cerebras.__path__)}))
"""


@pytest.mark.parametrize("first", ["pytorch", "modelzoo"])
def test_model_zoo_namespace_portion_imports_next_to_it(tmp_path, first):
    """A Model Zoo installed elsewhere (``cerebras/modelzoo/__init__.py``, no
    ``cerebras/__init__.py``) imports after ``cerebras.pytorch`` and before it; its own
    ``import cerebras.pytorch as cstorch`` gives cerebrax. The portion that comes first on
    the path changes with the order too."""
    zoo = tmp_path / "zoo"
    (zoo / "cerebras" / "modelzoo").mkdir(parents=True)
    (zoo / "cerebras" / "modelzoo" / "__init__.py").write_text(
        'import cerebras.pytorch as cstorch\nimport cerebras.pytorch.distributed as dist\n'
        'NAME = "modelzoo"\n')
    script = tmp_path / "zoo_check.py"
    script.write_text(_ZOO)
    order = ["cerebras.pytorch", "cerebras.modelzoo"]
    env = _env() if first == "pytorch" else _env(zoo)
    if first == "pytorch":
        env["PYTHONPATH"] += os.pathsep + str(zoo)
    else:
        order.reverse()
    result = _last_json(_run(script, *order, env=env))
    assert result["zoo"] == "modelzoo"
    assert result["zoo_cstorch"] and result["zoo_dist"] and result["cstorch"]
    assert result["file"] is None
    assert {str(zoo / "cerebras"), str(ALIAS / "cerebras")} <= set(result["path"])


_DATA_MODULE = """
import os, sys
import torch
import cerebras.pytorch.distributed as dist


class AliasDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        info = torch.utils.data.get_worker_info()
        same = (dist is sys.modules["cerebrax.distributed"]
                and sys.modules["cerebras.pytorch"] is sys.modules["cerebrax"]
                and dist.get_ordinal is sys.modules["cerebrax.data._streamers"].get_ordinal)
        return torch.tensor([index, int(same), -1 if info is None else info.id, os.getpid()])
"""

_TRAIN = """
import json, os, sys
import torch
IMPORT_LINE


def train():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    compiled = cstorch.compile(model, backend="CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = cstorch.optim.lr_scheduler.LinearLR(optimizer, 0.1, 0.01, total_iters=4)
    losses = []

    @cstorch.trace
    def training_step(x, y):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        return loss

    @cstorch.step_closure
    def record(loss):
        losses.append(float(loss))

    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(4):
        record(training_step(x, x[:, :2] * 2))
    return {"losses": losses, "name": cstorch.__name__,
            "weight": model[0].weight.detach().numpy().tolist()}
"""

# The script a user runs unchanged: its data module is re-imported by the loader's workers
# (spawn and forkserver start new interpreters that import __main__ and alias_data).
_SCRIPT_MAIN = """
from alias_data import AliasDataset

if __name__ == "__main__":
    result = train()
    result["alias"] = "cerebras.pytorch" in sys.modules
    result["rows"] = {}
    for context in sys.argv[1:]:
        loader = torch.utils.data.DataLoader(AliasDataset(), batch_size=2, num_workers=2,
                                             multiprocessing_context=context)
        result["rows"][context] = torch.cat(list(loader)).tolist()
    result["pid"] = os.getpid()
    print(json.dumps(result))
"""


def test_an_unmodified_cstorch_script_trains_and_its_dataloader_workers_import_it(tmp_path):
    """A script with ``import cerebras.pytorch as cstorch``, run by ``cerebrax run`` in its
    own interpreter (one, to start torch and JAX once):

    - the workers of a torch DataLoader (``spawn``, then ``forkserver``, 2 each) re-import
      its data module, whose first lines import ``cerebras.pytorch.distributed``: the alias
      holds there too;
    - its tiny training loop gives the losses and weights of the same loop with
      ``import cerebrax as cstorch``, run here meanwhile (the conftest fixture gave this
      test a fresh cerebrax state)."""
    torch = pytest.importorskip("torch")

    (tmp_path / "alias_data.py").write_text(_DATA_MODULE)
    script = tmp_path / "cstorch_script.py"
    script.write_text(_TRAIN.replace("IMPORT_LINE", "import cerebras.pytorch as cstorch")
                      + _SCRIPT_MAIN)
    contexts = ["spawn", "forkserver"]
    # Through the runner, with nothing of the alias on the path: `cerebrax run` turns it
    # on for the script and for the worker processes it starts.
    child = subprocess.Popen([sys.executable, "-m", "cerebrax", "run", str(script), *contexts],
                             cwd=tmp_path, env=_plain_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        namespace: dict = {"__name__": "reference_script"}
        rng = torch.random.get_rng_state()
        try:
            reference = _TRAIN.replace("IMPORT_LINE", "import cerebrax as cstorch")
            exec(reference, namespace)  # noqa: S102
            real = json.loads(json.dumps(namespace["train"]()))
        finally:
            torch.random.set_rng_state(rng)
        out, err = child.communicate(timeout=240)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, out + err
    result = json.loads(out.strip().splitlines()[-1])

    assert list(result["rows"]) == contexts
    for context, rows in result["rows"].items():
        assert sorted(r[0] for r in rows) == list(range(8)), context
        assert all(r[1] == 1 for r in rows), (context, rows)
        assert {r[2] for r in rows} == {0, 1}, context  # both workers served batches
        assert result["pid"] not in {r[3] for r in rows}, context  # in other processes

    assert result["alias"] and result["name"] == real["name"] == "cerebrax"
    assert len(result["losses"]) == 4 and result["losses"][-1] < result["losses"][0]
    assert result["losses"] == real["losses"]
    assert result["weight"] == real["weight"]


# ------------------------------------------------------------------------ cerebrax run


def _cerebrax_run(tmp_path, script_text: str, *args: str, env=None):
    script = tmp_path / "user_script.py"
    script.write_text(script_text)
    return subprocess.run([sys.executable, "-m", "cerebrax", "run", str(script), *args],
                          cwd=tmp_path, env=env or _plain_env(), capture_output=True,
                          text=True, timeout=180)


def test_importing_cerebrax_alone_does_not_create_the_alias(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import cerebrax\ntry:\n    import cerebras.pytorch\n"
                      "except ModuleNotFoundError:\n    print('absent')\n")
    done = _run(script, env=_plain_env())
    assert done.returncode == 0 and done.stdout.strip() == "absent", done.stdout + done.stderr


_ARGV = """
import json, sys
import cerebras.pytorch as cstorch
import cerebras.pytorch.distributed as dist
import cerebrax
print(json.dumps({"argv": sys.argv[1:], "name": __name__, "first": sys.path[0],
                  "same": cstorch is cerebrax and dist is cerebrax.distributed}))
sys.exit(int(sys.argv[1]))
"""


def test_cerebrax_run_runs_the_script_as_python_would(tmp_path):
    """The script's arguments, ``__name__ == "__main__"``, its folder first on the path,
    the alias, and its exit status."""
    done = _cerebrax_run(tmp_path, _ARGV, "3", "--lr", "0.1")
    assert done.returncode == 3, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"argv": ["3", "--lr", "0.1"], "name": "__main__",
                      "first": str(tmp_path), "same": True}
    assert _cerebrax_run(tmp_path, _ARGV, "0").returncode == 0


def test_cerebrax_run_refuses_to_shadow_a_real_cerebras_pytorch(tmp_path):
    """With Cerebras' own package installed, ``cerebrax run`` says so and runs nothing."""
    real = tmp_path / "site"
    (real / "cerebras" / "pytorch").mkdir(parents=True)
    (real / "cerebras" / "pytorch" / "__init__.py").write_text("REAL = True\n")
    env = _plain_env()
    env["PYTHONPATH"] += os.pathsep + str(real)
    done = _cerebrax_run(tmp_path, "print('ran')\n", env=env)
    assert done.returncode == 2 and "ran" not in done.stdout
    assert "A real cerebras.pytorch is installed" in done.stderr
    assert str(real / "cerebras" / "pytorch") in done.stderr


def test_cerebrax_run_names_a_missing_script(tmp_path):
    done = subprocess.run([sys.executable, "-m", "cerebrax", "run", str(tmp_path / "no.py")],
                          env=_plain_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no such script or command" in done.stderr


_PROGRAM = """
import json, sys
import cerebras.pytorch as cstorch
import cerebrax


def main():
    print(json.dumps({"argv": sys.argv, "name": __name__, "same": cstorch is cerebrax}))
    return int(sys.argv[1])


if __name__ == "__main__":
    sys.exit(main())
"""


def _run_command(tmp_path, *argv: str, env=None):
    return subprocess.run([sys.executable, "-m", "cerebrax", "run", *argv], cwd=tmp_path,
                          env=env or _plain_env(), capture_output=True, text=True, timeout=180)


def _last_json(done) -> dict:
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cerebrax_run_m_runs_a_module_as_python_m_would(tmp_path):
    """``cerebrax run -m MODULE ARGS``: the module as ``__main__``, found from the current
    folder, ``sys.argv[0]`` its file, the alias on, its exit status."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "tool.py").write_text(_PROGRAM)
    done = _run_command(tmp_path, "-m", "pkg.tool", "4", "--x")
    assert done.returncode == 4, done.stderr
    assert _last_json(done) == {"argv": [str(tmp_path / "pkg" / "tool.py"), "4", "--x"],
                                "name": "__main__", "same": True}
    missing = _run_command(tmp_path, "-m", "pkg.absent")
    assert missing.returncode == 2 and "no module named 'pkg.absent'" in missing.stderr
    bare = _run_command(tmp_path, "-m")
    assert bare.returncode == 2 and "-m takes a module name" in bare.stderr


def test_cerebrax_run_runs_an_installed_console_script(tmp_path):
    """``cerebrax run cszoo fit ...``: a console script pip installed (an entry point of an
    installed distribution) runs with the alias on, its arguments, and its exit status."""
    site = tmp_path / "site"
    (site / "zootool").mkdir(parents=True)
    (site / "zootool" / "__init__.py").write_text("")
    (site / "zootool" / "cli.py").write_text(_PROGRAM)
    info = site / "zootool-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zootool\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nzoo-tool = zootool.cli:main\n")
    env = _plain_env()
    env["PYTHONPATH"] += os.pathsep + str(site)
    done = _run_command(tmp_path, "zoo-tool", "5", "fit", "params.yaml", env=env)
    assert done.returncode == 5, done.stderr
    result = _last_json(done)
    assert result["argv"][1:] == ["5", "fit", "params.yaml"]
    assert result["name"] == "zootool.cli" and result["same"] is True
    assert _run_command(tmp_path, "zoo-tool", "0", env=env).returncode == 0


def test_cerebrax_run_runs_a_python_program_on_path_and_refuses_others(tmp_path):
    """A Python file on PATH (a ``#!`` python first line) runs; a program in another
    language is refused by name, and an unknown name says what ``run`` takes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "pytool"
    tool.write_text("#!/usr/bin/env python3\n" + _PROGRAM)
    tool.chmod(0o755)
    shell = bin_dir / "shtool"
    shell.write_text("#!/bin/sh\necho hi\n")
    shell.chmod(0o755)
    env = _plain_env()
    env["PATH"] = str(bin_dir) + os.pathsep + env["PATH"]
    done = _run_command(tmp_path, "pytool", "6", env=env)
    assert done.returncode == 6, done.stderr
    assert _last_json(done) == {"argv": [str(tool), "6"], "name": "__main__", "same": True}
    refused = _run_command(tmp_path, "shtool", env=env)
    assert refused.returncode == 2 and "is not a Python program" in refused.stderr
    unknown = _run_command(tmp_path, "no-such-tool-here", env=env)
    assert unknown.returncode == 2
    assert "no such script or command 'no-such-tool-here'" in unknown.stderr
    assert "cerebrax run -m package.module" in unknown.stderr


def test_cerebrax_run_without_a_script_prints_its_usage(capsys):
    from cerebrax.cli import main

    assert main(["run"]) == 2
    assert "usage: cerebrax run SCRIPT [ARGS ...]" in capsys.readouterr().err
    assert main(["run", "--help"]) == 0
    assert "usage: cerebrax run SCRIPT" in capsys.readouterr().out
