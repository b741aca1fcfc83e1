"""The narrow fixes of ``cerebrax._torch_compat``: code written against torch 2.4 (Cerebras'
Model Zoo 2.10) runs under ``cerebrax run``; torch is unchanged outside it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")  # it checks torch under `cerebrax run`

ROOT = pathlib.Path(__file__).resolve().parents[2]

# What Model Zoo's trainer config serializer does: flatten a tree, rebuild every spec
# with dataclasses.replace (tuples become lists), unflatten.
_REPLACE = """
import dataclasses, json, sys
if sys.argv[1:] == ["early"]:
    import torch.utils._pytree  # imported before cerebras.pytorch: fixed at once
import cerebras.pytorch as cstorch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

def as_lists(spec):
    if spec.num_children == 0:
        return spec
    children = [as_lists(child) for child in spec.children_specs]
    kind = list if spec.type is tuple else spec.type
    return dataclasses.replace(spec, type=kind, children_specs=children)

values, spec = tree_flatten({"a": (1, (2, 3)), "b": [4], "c": {"d": (5,)}})
out = tree_unflatten(values, as_lists(spec))
plain = TreeSpec(dict, ["x"], [TreeSpec(None, None, [])])  # torch's own signature
print(json.dumps({"out": out, "plain": plain.num_leaves}))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _script(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    script = tmp_path / "zoo_config.py"
    script.write_text(text)
    return script


def test_treespec_dataclasses_replace_works_under_cerebrax_run(tmp_path):
    script = _script(tmp_path, _REPLACE)
    for when in ("late", "early"):
        done = subprocess.run([sys.executable, "-m", "cerebrax", "run", str(script), when],
                              cwd=tmp_path, env=_env(), capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result == {"out": {"a": [1, [2, 3]], "b": [4], "c": {"d": [5]}}, "plain": 1}


def test_torch_is_unchanged_outside_cerebrax_run(tmp_path):
    """Without the alias, torch's TreeSpec refuses the call as it always does."""
    script = _script(tmp_path, _REPLACE.replace("import cerebras.pytorch as cstorch\n",
                                                "import cerebrax\n"))
    done = subprocess.run([sys.executable, str(script), "late"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode != 0 and "unexpected keyword argument '_context'" in done.stderr
