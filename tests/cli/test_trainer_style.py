"""A program written as Cerebras Model Zoo's Trainer uses cstorch (tests/cli/
trainer_style_script.py: config classes from optimizer signatures, the BackendType enum,
traced methods with callbacks around the step, listener and lazy-tensor registrations,
SummaryWriter internals, DataLoader.id, DataExecutor(activation_steps=None), the initial
checkpoint), unmodified under ``cerebrax run``, trains as the same model in torch eager."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")  # the program is a torch training loop

SCRIPT = pathlib.Path(__file__).with_name("trainer_style_script.py")
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(folder: pathlib.Path, *args: str) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "result.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "cerebrax", "run", str(SCRIPT), *args,
                           "--out", str(out)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_a_trainer_style_program_trains_as_torch_eager(tmp_path):
    eager = _run(tmp_path / "eager", "--eager")
    got = _run(tmp_path / "cerebrax")
    for key in ("train", "norm", "norm0"):
        assert len(got[key]) == 4, key
        np.testing.assert_allclose(got[key], eager[key], rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(got["val"], eager["val"], rtol=1e-5)
    # the initial checkpoint holds the weights the model was built with
    np.testing.assert_array_equal(got["initial"], got["built"])
    # checkpoint steps 1 and 3 (0-based: global steps 2 and 4), and the initial one
    assert got["checkpoints"] == ["checkpoint_0.mdl", "checkpoint_2.mdl", "checkpoint_4.mdl"]
    assert got["streamed"] == 4 * 4
    first, second = got["loader_ids"]
    assert first != second and got["scope"] == f"validate_{second}"
    assert got["links"] == [True, True]
