"""`cerebrax fit` manages the run in its model_dir.

A second `fit` resumes from the newest checkpoint (with the losses of a run never
stopped), leftovers of killed saves are removed, old checkpoints are deleted as
``keep_last_n`` / ``keep_every_n_steps`` say, and a config other than the one the run
started with is refused by `fit` and `eval`. Each test runs the digits config on the
CPU backend in a subprocess, with one compile cache for all of them.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import cerebrax as cstorch

pytest.importorskip("sklearn")  # the digits data

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "digits_mlp.yaml"


def _env() -> dict:
    # This checkout first on the path: the command under test is its cerebrax.
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _cerebrax(command, *args, compile_dir, num_steps=20, checkpoint_steps=10, cwd):
    overrides = [
        "runconfig.backend=CPU",
        f"runconfig.num_steps={num_steps}",
        f"runconfig.checkpoint_steps={checkpoint_steps}",
        "runconfig.log_steps=1",
        f"runconfig.compile_dir={compile_dir}",
    ]
    return subprocess.run(
        [sys.executable, "-m", "cerebrax", command, CONFIG, *overrides, *map(str, args)],
        capture_output=True, text=True, timeout=180, cwd=cwd, env=_env(),
    )  # fmt: skip


def _losses(stdout: str) -> dict[int, str]:
    return {int(s): v for s, v in re.findall(r"^step\s+(\d+)\s+loss (\S+)$", stdout, re.M)}


def _steps(model_dir: pathlib.Path) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in model_dir.glob("checkpoint_*.mdl"))


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A straight 20-step run, and a run stopped at step 10 then started again."""
    tmp = tmp_path_factory.mktemp("cli_runs")
    compile_dir = tmp / "compile"
    straight = _cerebrax("fit", "--model_dir", tmp / "straight", compile_dir=compile_dir,
                         cwd=tmp)  # fmt: skip
    assert straight.returncode == 0, straight.stderr[-3000:]
    first = _cerebrax("fit", "--model_dir", tmp / "run", num_steps=10,
                      compile_dir=compile_dir, cwd=tmp)  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    leftover = tmp / "run" / f".checkpoint_20.mdl.tmp-{_dead_pid()}-0123abcd"
    leftover.write_bytes(b"half a checkpoint")
    second = _cerebrax("fit", "--model_dir", tmp / "run", compile_dir=compile_dir, cwd=tmp)
    assert second.returncode == 0, second.stderr[-3000:]
    return tmp, straight, second, leftover


def test_second_fit_resumes_with_the_losses_of_an_unstopped_run(runs):
    tmp, straight, second, _ = runs
    assert f"resumed from {tmp / 'run' / 'checkpoint_10.mdl'} at step 10" in second.stdout
    assert _losses(second.stdout) == {s: v for s, v in _losses(straight.stdout).items()
                                      if s > 10}  # fmt: skip
    assert _steps(tmp / "run") == [10, 20]
    a = cstorch.load(tmp / "straight" / "checkpoint_20.mdl")
    b = cstorch.load(tmp / "run" / "checkpoint_20.mdl")
    for x, y in zip(jax.tree.leaves(a["model"]), jax.tree.leaves(b["model"]), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert (tmp / "run" / "run_config.yaml").is_file()


def test_fit_removes_the_leftovers_of_killed_saves(runs):
    assert not runs[3].exists()


def test_finished_run_says_how_to_go_on(runs):
    tmp = runs[0]
    out = _cerebrax("fit", "--model_dir", tmp / "run", compile_dir=tmp / "compile", cwd=tmp)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "nothing is left to train" in out.stderr and "--overwrite" in out.stderr


@pytest.mark.parametrize("command", ["fit", "eval"])
def test_another_config_is_refused_naming_the_key(runs, command):
    tmp = runs[0]
    out = _cerebrax(command, "--model_dir", tmp / "run", "model.hidden=64",
                    "train_input.batch_size=32", compile_dir=tmp / "compile",
                    cwd=tmp)  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    for text in ("run_config.yaml", "model.hidden: 128 then, 64 now",
                 "train_input.batch_size: 64 then, 32 now", "--model_dir"):
        assert text in out.stderr, out.stderr
    assert ("--overwrite" in out.stderr) == (command == "fit")
    assert "num_steps" not in out.stderr  # may change between resumptions


def test_eval_takes_the_newest_checkpoint_of_its_run(runs):
    tmp = runs[0]
    out = _cerebrax("eval", "--model_dir", tmp / "run", compile_dir=tmp / "compile", cwd=tmp)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"evaluating {tmp / 'run' / 'checkpoint_20.mdl'} (step 20)" in out.stdout


def test_no_resume_refuses_to_write_over_a_run(runs):
    tmp = runs[0]
    out = _cerebrax("fit", "--model_dir", tmp / "run", "--no-resume",
                    compile_dir=tmp / "compile", cwd=tmp)  # fmt: skip
    assert out.returncode == 1, out.stderr[-3000:]
    assert "--no-resume" in out.stderr and "--overwrite" in out.stderr
    assert _steps(tmp / "run") == [10, 20]


def test_retention_keeps_the_last_n_and_every_nth_step(runs):
    tmp = runs[0]
    model_dir = tmp / "kept"
    out = _cerebrax("fit", "--model_dir", model_dir, "runconfig.keep_last_n=2",
                    "runconfig.keep_every_n_steps=8", checkpoint_steps=2,
                    compile_dir=tmp / "compile", cwd=tmp)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert _steps(model_dir) == [8, 16, 18, 20]
    # --overwrite starts over: the old checkpoints go, the new run's config is recorded.
    out = _cerebrax("fit", "--model_dir", model_dir, "--overwrite", "model.hidden=64",
                    num_steps=2, checkpoint_steps=0, compile_dir=tmp / "compile",
                    cwd=tmp)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert _steps(model_dir) == [2]
    assert "hidden: 64" in (model_dir / "run_config.yaml").read_text()


@pytest.mark.parametrize("value", [0, -1, "two"])
def test_retention_keys_are_validated(runs, value):
    tmp = runs[0]
    out = _cerebrax("fit", f"runconfig.keep_last_n={value}", compile_dir=tmp / "compile",
                    cwd=tmp)  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    assert "runconfig.keep_last_n" in out.stderr
