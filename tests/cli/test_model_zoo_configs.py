"""Model-Zoo-shaped configs through the `cerebrax` command: both layouts, the optimizer's
clipping and loss-scaling keys in the compiled step, and every unknown key refused.

The runs are subprocesses (`python -m cerebrax`, this checkout first on the path) on a
tiny MLP over Gaussian blobs (tests/cli/zoo_parts.py), 1 to 20 steps each.
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
from cerebrax._cli import _build, _config
from cerebrax.cli import main
from cerebrax.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[2]
PARTS = pathlib.Path(__file__).resolve().parent / "zoo_parts.py"


def _cerebrax(*args, cwd) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "cerebrax", *map(str, args)],
        capture_output=True, text=True, timeout=180, cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip


def _write(tmp_path: pathlib.Path, config: dict) -> pathlib.Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _losses(stdout: str) -> dict[int, float]:
    return {int(s): float(v) for s, v in re.findall(r"^step\s+(\d+)\s+loss (\S+)$", stdout, re.M)}


def _fc_mnist_v1(tmp_path: pathlib.Path, **runconfig) -> dict:
    """The shape of a Model Zoo fc_mnist params file (sectioned layout)."""
    return {
        "train_input": {"input_fn": f"{PARTS}:blobs", "batch_size": 16, "shuffle": True},
        "eval_input": {"input_fn": f"{PARTS}:blobs", "split": "test", "batch_size": 16},
        "model": {"factory": f"{PARTS}:mlp", "hidden": 16, "mixed_precision": True},
        "optimizer": {"optimizer_type": "SGD", "learning_rate": 0.05, "momentum": 0.9},
        "metrics": ["accuracy"],
        "runconfig": {
            "max_steps": 20, "checkpoint_steps": 10, "log_steps": 5, "seed": 1,
            "save_initial_checkpoint": True, "eval_steps": 3, "backend": "CPU",
            "model_dir": str(tmp_path / "run"), "compile_dir": str(tmp_path / "compile"),
            **runconfig,
        },
    }  # fmt: skip


def _gpt2_v1(tmp_path: pathlib.Path) -> dict:
    """The optimizer of a Model Zoo GPT-2 params file, on the emulated wafer (CSX)."""
    config = _fc_mnist_v1(tmp_path, backend="CSX", precision_opt_level=1)
    config["optimizer"] = {
        "optimizer_type": "AdamW",
        "weight_decay": 0.011,
        "correct_bias": True,
        "learning_rate": [
            {"scheduler": "Linear", "initial_learning_rate": 0.0,
             "end_learning_rate": 0.01, "total_iters": 5},
            {"scheduler": "CosineDecay", "initial_learning_rate": 0.01,
             "end_learning_rate": 0.001, "total_iters": 15},
        ],
        "max_gradient_norm": 1.0,
        "loss_scaling_factor": "dynamic",
        "initial_loss_scale": 2.0**8,
        "max_loss_scale": 2.0**30,
        "steps_per_increase": 5,
    }  # fmt: skip
    config["model"]["fp16_type"] = "float16"
    return config


def _trainer_v2(tmp_path: pathlib.Path) -> dict:
    """The same job in the trainer: layout."""
    blobs = {"input_fn": f"{PARTS}:blobs", "batch_size": 16}
    return {
        "trainer": {
            "init": {
                "backend": {"backend_type": "CPU", "compile_dir": str(tmp_path / "compile")},
                "model_dir": str(tmp_path / "run"),
                "seed": 1,
                "model": {"factory": f"{PARTS}:mlp", "hidden": 16},
                "optimizer": {"SGD": {"lr": 0.05, "momentum": 0.9}},
                "schedulers": [{"CosineDecayLR": {"initial_learning_rate": 0.05,
                                                  "end_learning_rate": 0.005,
                                                  "total_iters": 20}}],
                "precision": {"max_gradient_norm": 5.0},
                "loop": {"max_steps": 20, "eval_steps": 4},
                "checkpoint": {"steps": 10},
                "logging": {"log_steps": 5},
                "metrics": ["accuracy"],
            },
            "fit": {"train_dataloader": {**blobs, "shuffle": True},
                    "val_dataloader": {**blobs, "split": "test"}},
        }
    }  # fmt: skip


def _fit_then_eval(tmp_path: pathlib.Path, config: dict) -> tuple[str, str]:
    path = _write(tmp_path, config)
    fit = _cerebrax("fit", path, cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    losses = _losses(fit.stdout)
    assert sorted(losses) == [5, 10, 15, 20]
    assert losses[20] < losses[5]
    evaluated = _cerebrax("eval", path, cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "checkpoint_20.mdl" in evaluated.stdout
    assert float(re.search(r"^eval accuracy (\S+)", evaluated.stdout, re.M).group(1)) >= 0.8
    return fit.stdout, evaluated.stdout


def _checkpoints(tmp_path: pathlib.Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "run").glob("checkpoint_*.mdl"))


def test_fc_mnist_shaped_config_fits_and_evaluates(tmp_path):
    _, evaluated = _fit_then_eval(tmp_path, _fc_mnist_v1(tmp_path))
    # save_initial_checkpoint: the weights before the first step are checkpoint_0.
    assert _checkpoints(tmp_path) == ["checkpoint_0.mdl", "checkpoint_10.mdl", "checkpoint_20.mdl"]
    assert re.search(r"^eval loss \S+\s+\(3 steps\)", evaluated, re.M)  # runconfig.eval_steps


def test_gpt2_shaped_config_clips_and_scales_the_loss(tmp_path):
    fit, _ = _fit_then_eval(tmp_path, _gpt2_v1(tmp_path))
    assert "runconfig.precision_opt_level: 1" in fit
    scaler = cstorch.load(tmp_path / "run" / "checkpoint_20.mdl")["grad_scaler"]
    # Dynamic scaling from 2**8, doubled after every 5 finite steps: 20 steps, 4 doublings
    # (fewer if a step overflowed, which halves it): the scale moved.
    scale = float(np.asarray(scaler["loss_scale"]))
    assert scale != 2.0**8
    assert scale <= 2.0**12
    first = cstorch.load(tmp_path / "run" / "checkpoint_10.mdl")["grad_scaler"]
    assert float(np.asarray(first["loss_scale"])) != scale


def test_trainer_layout_fits_and_evaluates(tmp_path):
    _, evaluated = _fit_then_eval(tmp_path, _trainer_v2(tmp_path))
    assert _checkpoints(tmp_path) == ["checkpoint_10.mdl", "checkpoint_20.mdl"]
    assert re.search(r"^eval loss \S+\s+\(4 steps\)", evaluated, re.M)  # loop.eval_steps


def test_validation_during_fit_and_tensorboard_events(tmp_path):
    """trainer.init.loop.eval_frequency: the eval step runs at steps 10 and 20 (compiled
    once: a traced step that would compile again raises RecompileError), and step 20's values equal `cerebrax eval` of checkpoint_20. The run's
    TensorBoard events (read back by TensorBoard's reader) hold the logged losses, the
    scheduler's closed-form rates, the validation's values and steps/s."""
    pytest.importorskip("torch")  # the validation dataloader is a torch DataLoader
    config = _trainer_v2(tmp_path)
    config["trainer"]["init"]["loop"]["eval_frequency"] = 10
    path = _write(tmp_path, config)
    fit = _cerebrax("fit", path, cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    validations = {
        int(s): (float(loss), float(accuracy)) for s, loss, accuracy in re.findall(
            r"^step\s+(\d+)\s+eval loss (\S+)\s+accuracy (\S+)\s+\(4 steps\)$", fit.stdout, re.M)
    }  # fmt: skip
    assert sorted(validations) == [10, 20], fit.stdout
    evaluated = _cerebrax("eval", path, cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    loss = float(re.search(r"^eval loss (\S+)", evaluated.stdout, re.M).group(1))
    accuracy = float(re.search(r"^eval accuracy (\S+)", evaluated.stdout, re.M).group(1))
    np.testing.assert_allclose(validations[20], (loss, accuracy), rtol=1e-6)

    reader = cstorch.utils.tensorboard.SummaryReader(tmp_path / "run")
    losses = _losses(fit.stdout)
    logged = dict(reader.scalars("loss"))
    assert sorted(logged) == [5, 10, 15, 20]
    np.testing.assert_allclose([logged[s] for s in sorted(logged)],
                               [losses[s] for s in sorted(logged)], rtol=1e-6)
    # CosineDecayLR from 0.05 to 0.005 over 20 steps: step s trains with the rate of s - 1.
    rates = dict(reader.scalars("lr"))
    expected = [0.005 + 0.045 * 0.5 * (1 + np.cos(np.pi * (s - 1) / 20)) for s in sorted(rates)]
    np.testing.assert_allclose([rates[s] for s in sorted(rates)], expected, rtol=1e-5)
    # The printed values have 6 decimals.
    np.testing.assert_allclose(dict(reader.scalars("eval/loss"))[20], loss, rtol=0, atol=5e-7)
    np.testing.assert_allclose(dict(reader.scalars("eval/accuracy"))[20], accuracy, rtol=0,
                               atol=5e-7)
    assert sorted(dict(reader.scalars("steps_per_sec"))) == [10, 15, 20]
    assert all(v > 0 for _, v in reader.scalars("steps_per_sec"))


def test_eval_frequency_without_eval_data_is_refused():
    raw = _trainer_v2(pathlib.Path("/nonexistent"))
    raw["trainer"]["fit"].pop("val_dataloader")
    raw["trainer"]["init"]["loop"]["eval_frequency"] = 10
    with pytest.raises(ConfigError, match=r"^trainer\.init\.loop\.eval_frequency: validation "
                                          r"during fit reads the eval data"):
        _config.require(_config.parse(raw), "fit")


@pytest.mark.parametrize("key, bound", [("max_gradient_norm", 1e-3), ("max_gradient_value", 1e-3)])
def test_clipping_from_the_optimizer_section_is_in_the_step(tmp_path, key, bound):
    # One SGD step without momentum: the update is -lr * clip(gradient). The gradient is far
    # above the bound, so the update's global norm (or largest entry) is lr * bound.
    config = _fc_mnist_v1(tmp_path, max_steps=1, checkpoint_steps=0)
    config["optimizer"] = {"optimizer_type": "SGD", "learning_rate": 0.1, key: bound}
    out = _cerebrax("fit", _write(tmp_path, config), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    before = jax.tree.leaves(cstorch.load(tmp_path / "run" / "checkpoint_0.mdl")["model"])
    after = jax.tree.leaves(cstorch.load(tmp_path / "run" / "checkpoint_1.mdl")["model"])
    delta = np.concatenate([(np.asarray(a) - np.asarray(b)).ravel() for a, b in zip(after, before)])
    size = np.linalg.norm(delta) if key == "max_gradient_norm" else np.abs(delta).max()
    np.testing.assert_allclose(size, 0.1 * bound, rtol=2e-3)  # float32 parameters


# ---- refusals ------------------------------------------------------------------------------
def _v1_minimal() -> dict:
    config = _fc_mnist_v1(pathlib.Path("/nonexistent"))
    config["loss_scaling"] = {"loss_scale": "dynamic"}
    return config


def _v2_minimal() -> dict:
    config = _trainer_v2(pathlib.Path("/nonexistent"))
    val = dict(config["trainer"]["fit"]["val_dataloader"])
    config["trainer"]["validate"] = {"val_dataloader": val}  # the same: no conflict
    return config


# Every section that takes a fixed set of keys: (layout, section path).
FIXED_SECTIONS = [
    ("v1", ""), ("v1", "runconfig"), ("v1", "optimizer"), ("v1", "loss_scaling"),
    ("v2", ""), ("v2", "trainer"), ("v2", "trainer.init"), ("v2", "trainer.init.backend"),
    ("v2", "trainer.init.precision"), ("v2", "trainer.init.loop"),
    ("v2", "trainer.init.checkpoint"), ("v2", "trainer.init.logging"),
    ("v2", "trainer.init.optimizer.SGD"), ("v2", "trainer.fit"), ("v2", "trainer.validate"),
]  # fmt: skip


@pytest.mark.parametrize("layout, section", FIXED_SECTIONS)
def test_unknown_key_in_a_fixed_section_is_refused_by_its_path(layout, section):
    raw = _v1_minimal() if layout == "v1" else _v2_minimal()
    key = f"{section}.not_a_key" if section else "not_a_key"
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)} is not a known"):
        _config.parse(_config.apply_overrides(raw, [f"{key}=1"]))


# Sections whose other keys are arguments of the configured function.
ARGUMENT_SECTIONS = [
    ("v1", "model"), ("v1", "train_input"), ("v1", "eval_input"),
    ("v2", "trainer.init.model"), ("v2", "trainer.fit.train_dataloader"),
    ("v2", "trainer.fit.val_dataloader"),
]  # fmt: skip


@pytest.mark.parametrize("layout, section", ARGUMENT_SECTIONS)
def test_unknown_argument_in_a_function_section_is_refused_by_its_path(layout, section):
    raw = _v1_minimal() if layout == "v1" else _v2_minimal()
    raw.get("trainer", {}).pop("validate", None)  # one val_dataloader to change
    job = _config.parse(_config.apply_overrides(raw, [f"{section}.not_a_key=1"]))
    match = rf"^{re.escape(section)}\.not_a_key: \w+\(\) takes no argument 'not_a_key'"
    with pytest.raises(ConfigError, match=match):
        if section.endswith("model"):
            factory = _build.resolve(job.model_factory, "model.factory")
            _build.check_arguments(factory, job.model_kwargs, job.model_where)
        else:
            spec = job.eval_input if "val" in section or "eval" in section else job.train_input
            _build.build_loader(spec)


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimizer.momentum=fast", "optimizer.momentum must be a number >= 0, got 'fast'"),
        ("optimizer.max_gradient_norm=-1", "optimizer.max_gradient_norm must be a number > 0"),
        ("optimizer.loss_scaling_factor=sometimes",
         "optimizer.loss_scaling_factor must be 'dynamic' or a number > 0, got 'sometimes'"),
        ("runconfig.eval_frequency=0", "runconfig.eval_frequency must be an integer > 0, got 0"),
        ("runconfig.seed=one", "runconfig.seed must be an integer, got 'one'"),
        ("runconfig.save_initial_checkpoint=maybe",
         "runconfig.save_initial_checkpoint must be true or false, got 'maybe'"),
        ("runconfig.num_steps=30", "runconfig.num_steps (30) and runconfig.max_steps (20)"),
        ("model.name=gpt2", "model.name: cerebrax has no model registry"),
        ("train_input.data_processor=GptHDF5DataProcessor",
         "train_input.data_processor: cerebrax has no data-processor registry"),
        ("optimizer.adjust_learning_rate={}", "optimizer.adjust_learning_rate: per-parameter"),
    ],
)  # fmt: skip
def test_bad_model_zoo_value_exits_2_with_one_message(tmp_path, capsys, override, message):
    path = _write(tmp_path, _v1_minimal())
    assert main(["fit", str(path), override]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("error:") == 1


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.init.loop.eval_frequency=often",
         "trainer.init.loop.eval_frequency must be an integer > 0, got 'often'"),
        ("trainer.init.optimizer.SGD.momentum=fast",
         "trainer.init.optimizer.SGD.momentum must be a number >= 0, got 'fast'"),
        ("trainer.init.precision.initial_loss_scale=16",
         "trainer.init.precision: initial_loss_scale configure(s) dynamic loss scaling"),
        ("trainer.init.callbacks=[]", "trainer.init.callbacks: callbacks are not built"),
        ("trainer.init.loop.grad_accum_steps=2", "trainer.init.loop.grad_accum_steps: gradient"),
    ],
)  # fmt: skip
def test_bad_trainer_value_exits_2_with_one_message(tmp_path, capsys, override, message):
    path = _write(tmp_path, _v2_minimal())
    assert main(["fit", str(path), override]) == 2
    assert message in capsys.readouterr().err
