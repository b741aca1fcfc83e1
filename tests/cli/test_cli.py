"""The `cerebrax` command, run as `python -m cerebrax` in subprocesses.

The job is a small MLP on synthetic Gaussian blobs (written into tmp_path), on the CPU
backend so that a resumed run can be compared with the uninterrupted one bit for bit.
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
import yaml

import cerebrax as cstorch

REPO = pathlib.Path(__file__).resolve().parents[2]

JOB_MODULE = '''
import jax
import numpy as np
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs, hidden):
        self.fc1 = nnx.Linear(8, hidden, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, 4, rngs=rngs)

    def __call__(self, x):
        return self.fc2(jax.nn.relu(self.fc1(x)))


def mlp(hidden=16, seed=0):
    return MLP(nnx.Rngs(seed), hidden)


def blobs(split="train", batch_size=16, seed=0):
    """Four separable clusters; 7 training batches, so a 20-step run spans 3 epochs."""
    centers = np.random.default_rng(123).normal(size=(4, 8)).astype(np.float32) * 3
    n = 7 * batch_size if split == "train" else 4 * batch_size
    rng = np.random.default_rng(seed if split == "train" else seed + 1)
    y = rng.integers(0, 4, size=n).astype(np.int32)
    x = centers[y] + rng.normal(size=(n, 8)).astype(np.float32)
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n, batch_size)]


def broken(split="train", batch_size=16):
    raise RuntimeError("the data source is down")
'''


def _config(tmp_path: pathlib.Path, **runconfig) -> dict:
    module = tmp_path / "job.py"
    module.write_text(JOB_MODULE)
    return {
        "model": {"factory": f"{module}:mlp", "hidden": 16},
        "train_input": {"input_fn": f"{module}:blobs", "batch_size": 16},
        "eval_input": {"input_fn": f"{module}:blobs", "split": "test", "batch_size": 16},
        "optimizer": {
            "optimizer_type": "SGD",
            "momentum": 0.9,
            "learning_rate": {
                "scheduler": "CosineDecay",
                "initial_learning_rate": 0.05,
                "end_learning_rate": 0.005,
                "total_iters": 20,
            },
        },
        "loss_scaling": {"loss_scale": "dynamic"},
        "max_gradient_norm": 5.0,
        "metrics": ["accuracy"],
        "runconfig": {
            "num_steps": 20,
            "checkpoint_steps": 10,
            "log_steps": 1,
            "backend": "CPU",
            "model_dir": str(tmp_path / "run"),
            "compile_dir": str(tmp_path / "compile"),
            **runconfig,
        },
    }


def _write(tmp_path: pathlib.Path, config: dict, name: str = "job.yaml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def _cerebrax(*args, cwd) -> subprocess.CompletedProcess:
    # REPO first on the path: the command under test is this checkout's cerebrax, not an
    # installed one (the subprocess runs in another directory).
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "cerebrax", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
    )


def _losses(stdout: str) -> dict[int, str]:
    return {int(s): v for s, v in re.findall(r"^step\s+(\d+)\s+loss (\S+)$", stdout, re.M)}


def _first_step(stdout: str) -> str:
    return re.search(r"first step in [\d.]+ s \(compile cache (\w[\w ]*):", stdout).group(1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """An uninterrupted 20-step run and a run resumed from its step-10 checkpoint."""
    tmp_path = tmp_path_factory.mktemp("cli")
    config = _write(tmp_path, _config(tmp_path))
    full = _cerebrax("fit", config, cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    resumed = _cerebrax(
        "fit",
        config,
        "--checkpoint",
        tmp_path / "run" / "checkpoint_10.mdl",
        "--model_dir",
        tmp_path / "resumed",
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return tmp_path, config, full, resumed


def test_fit_prints_falling_losses_and_checkpoints(trained):
    tmp_path, _, full, _ = trained
    losses = _losses(full.stdout)
    assert sorted(losses) == list(range(1, 21))
    assert float(losses[20]) < float(losses[1]) / 2
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint_*.mdl")) == [
        "checkpoint_10.mdl",
        "checkpoint_20.mdl",
    ]
    state = cstorch.load(tmp_path / "run" / "checkpoint_10.mdl")
    assert int(np.asarray(state["global_step"])) == 10
    for key in ("model", "optimizer", "schedulers", "grad_scaler", "dataloader"):
        assert key in state


def test_resumed_run_continues_the_same_trajectory(trained):
    tmp_path, _, full, resumed = trained
    assert "resumed from" in resumed.stdout
    expected = {s: v for s, v in _losses(full.stdout).items() if s > 10}
    assert _losses(resumed.stdout) == expected
    assert [p.name for p in (tmp_path / "resumed").glob("checkpoint_*.mdl")] == [
        "checkpoint_20.mdl"
    ]
    a = cstorch.load(tmp_path / "run" / "checkpoint_20.mdl")
    b = cstorch.load(tmp_path / "resumed" / "checkpoint_20.mdl")
    for part in ("model", "optimizer"):
        leaves_a, leaves_b = jax.tree.leaves(a[part]), jax.tree.leaves(b[part])
        assert len(leaves_a) == len(leaves_b) > 0
        for x, y in zip(leaves_a, leaves_b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bit for bit


def test_resume_without_dataloader_state_skips_the_consumed_batches(trained):
    # A checkpoint written by a hand-made loop may hold no data loader state; the command
    # then skips the batches the first 10 steps consumed (across an epoch boundary here).
    tmp_path, config, full, _ = trained
    state = dict(cstorch.load(tmp_path / "run" / "checkpoint_10.mdl"))
    del state["dataloader"]
    state = jax.tree.map(lambda x: np.asarray(x) if hasattr(x, "shape") else x, state)
    cstorch.save(state, tmp_path / "no_data_state.mdl")
    out = _cerebrax("fit", config, "--checkpoint", tmp_path / "no_data_state.mdl",
                    "--model_dir", tmp_path / "skipped", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    expected = {s: v for s, v in _losses(full.stdout).items() if s > 10}
    assert _losses(out.stdout) == expected


def test_second_process_loads_the_step_from_the_compile_cache(trained):
    tmp_path, _, full, resumed = trained
    assert _first_step(full.stdout) == "miss"
    assert _first_step(resumed.stdout) == "hit"  # same step, same compile_dir
    assert any((tmp_path / "compile" / "jax_cache").iterdir())


def test_eval_prints_loss_and_accuracy(trained):
    tmp_path, config, _, _ = trained
    out = _cerebrax("eval", config, cwd=tmp_path)  # the newest checkpoint of model_dir
    assert out.returncode == 0, out.stderr[-3000:]
    assert "checkpoint_20.mdl" in out.stdout
    assert float(re.search(r"^eval loss (\S+)", out.stdout, re.M).group(1)) < 1.0
    assert float(re.search(r"^eval accuracy (\S+)", out.stdout, re.M).group(1)) >= 0.8


def test_eval_progress_shows_the_mean_loss_it_prints(trained):
    # Off a terminal the bar is one summary line on stderr; its loss is the running mean
    # at the last step, the same quantity as the `eval loss` line (to the bar's 4 digits).
    tmp_path, config, _, _ = trained
    out = _cerebrax("eval", config, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    bar = re.search(r"^\[cerebrax\] step 4/4 \| .* steps/s \| loss (\S+)$", out.stderr, re.M)
    mean = float(re.search(r"^eval loss (\S+)", out.stdout, re.M).group(1))
    assert float(bar.group(1)) == float(f"{mean:.4g}")


def test_fit_off_a_terminal_prints_one_progress_line(trained):
    _, _, full, _ = trained
    assert "\r" not in full.stderr and "\r" not in full.stdout
    assert len(re.findall(r"^\[cerebrax\] step 20/20 \| ", full.stderr, re.M)) == 1
    assert "[cerebrax] step" not in full.stdout  # the log alone goes to stdout


def test_validate_traces_and_runs_nothing(tmp_path):
    config = _write(tmp_path, _config(tmp_path))
    out = _cerebrax("validate", config, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "validated `training_step`" in out.stdout
    assert not _losses(out.stdout)
    assert not list((tmp_path / "run").glob("checkpoint_*"))
    assert not list((tmp_path / "compile").glob("*.hlo.txt"))


def test_compile_writes_hlo_and_memory_report_and_runs_nothing(tmp_path):
    config = _write(tmp_path, _config(tmp_path, backend="CSX", half_dtype="float32"))
    out = _cerebrax("compile", config, "--mode", "eval", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    hlo = tmp_path / "compile" / "evaluation_step.hlo.txt"
    report = tmp_path / "compile" / "evaluation_step.memory.txt"
    assert "module" in hlo.read_text()
    assert "argument_size_in_bytes" in report.read_text()
    assert "argument_size_in_bytes" in out.stdout  # the report is printed
    assert not _losses(out.stdout) and "eval loss" not in out.stdout
    assert not list((tmp_path / "run").glob("checkpoint_*"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["runconfig.num_steps=-3"], "runconfig.num_steps must be an integer > 0, got -3"),
        (["runconfig.num_csx=0"], "runconfig.num_csx must be an integer >= 1, got 0"),
        (["optimizer.optimizer_type=Adamm"], "optimizer: Invalid optimizer type"),
        (["model.factory=no_such_module:mlp"], "model.factory: cannot import 'no_such_module'"),
        (["runconfig.num_step=3"], "runconfig.num_step is not a known key"),
        (["runconfig"], "override 'runconfig' must look like key.path=value"),
    ],
)
def test_bad_config_exits_2_naming_the_key(tmp_path, overrides, message):
    config = _write(tmp_path, _config(tmp_path))
    out = _cerebrax("fit", config, *overrides, cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_other_failures_exit_1(tmp_path):
    config = _config(tmp_path)
    config["train_input"]["input_fn"] = f"{tmp_path / 'job.py'}:broken"
    out = _cerebrax("fit", _write(tmp_path, config), cwd=tmp_path)
    assert out.returncode == 1
    assert "the data source is down" in out.stderr


def test_shipped_config_validates(tmp_path):
    pytest.importorskip("sklearn")
    config = REPO / "configs" / "digits_mlp.yaml"
    # Run from elsewhere: the config's python_paths make examples/ importable.
    out = _cerebrax(
        "validate", config, "runconfig.backend=CPU", "--model_dir", tmp_path / "run", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "validated `training_step`" in out.stdout
    assert yaml.safe_load(config.read_text())["runconfig"]["num_steps"] == 600


def test_help_lists_the_commands():
    out = subprocess.run(
        [sys.executable, "-m", "cerebrax", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    for command in ("fit", "eval", "validate", "compile"):
        assert command in out.stdout
