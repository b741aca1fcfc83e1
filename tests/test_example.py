"""The README's main job: the digits example trains to >= 0.9 test accuracy."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("sklearn")

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "train_digits.py"


@pytest.mark.parametrize("backend", ["CSX", "CPU"])
def test_digits_example_trains(tmp_path, backend):
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--backend", backend, "--num-steps", "300",
         "--checkpoint-steps", "100", "--model-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out.stdout)]
    assert len(losses) >= 3 and losses[-1] < losses[0] / 4
    accuracy = float(re.search(r"test accuracy: (\d\.\d+)", out.stdout).group(1))
    assert accuracy >= 0.9
    saved = sorted(p.name for p in tmp_path.glob("checkpoint_*.mdl"))
    assert saved == ["checkpoint_100.mdl", "checkpoint_200.mdl", "checkpoint_300.mdl"]
