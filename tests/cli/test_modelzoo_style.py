"""A cstorch script written the way Model Zoo's models are (compiler annotations, pol and
current_pol, kernel and group annotaters, metrics updated inside forward in eval, int32
inputs, the data utilities), unmodified under ``cerebrax run``, trains and evaluates as the
same script in torch eager: 3 steps and 2 eval batches, on CPU and on CSX at float32."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")  # the script is a torch training loop

SCRIPT = pathlib.Path(__file__).with_name("modelzoo_style_script.py")


def _run(tmp_path, *args):
    out = subprocess.run([sys.executable, "-m", "cerebrax", "run", str(SCRIPT), *args],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("eager"), "--eager")


@pytest.mark.parametrize("backend", ["CPU", "CSX"])
def test_modelzoo_style_script_matches_torch_eager(tmp_path, eager, backend):
    got = _run(tmp_path, "--backend", backend)
    for key in ("train", "eval", "accuracy", "perplexity"):
        np.testing.assert_allclose(got[key], eager[key], rtol=1e-5, err_msg=key)
    assert len(got["train"]) == 3 and len(got["eval"]) == 2
