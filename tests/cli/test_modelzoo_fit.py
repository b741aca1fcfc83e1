"""`cerebrax fit` and `eval` on a Model Zoo params file: ``model.name`` and
``*_input.data_processor`` resolve through Model Zoo's registry, and their sections are
validated by the registered classes' config classes.

CI has no Model Zoo: ``tests/cli/fake_modelzoo`` stands in for its registry and config
interface (a tiny MLP whose ``forward((inputs, labels))`` returns its loss and updates
an accuracy metric in eval, and a data processor of seeded random data). Every run is a
subprocess with that folder on its PYTHONPATH: Model Zoo imports ``cerebras.pytorch``, so
the command enables the cstorch alias in those processes, never in this one.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml

pytest.importorskip("torch")  # Model Zoo's models are torch modules

REPO = pathlib.Path(__file__).resolve().parents[2]
FAKE_MODELZOO = pathlib.Path(__file__).resolve().parent / "fake_modelzoo"
PARTS = pathlib.Path(__file__).resolve().parent / "zoo_parts.py"
STEPS = 4
LR, MOMENTUM = 0.1, 0.9
MODEL = {"name": "tiny_mlp", "hidden": 16, "compute_eval_metrics": True}
TRAIN = {"data_processor": "TinyDataProcessor", "batch_size": 8}
EVAL = {"data_processor": "TinyDataProcessor", "batch_size": 8, "split": "val",
        "num_batches": 3}


def _env(*, modelzoo: bool) -> dict[str, str]:
    """This checkout on the path, and the fake Model Zoo before it when ``modelzoo``."""
    first = [str(FAKE_MODELZOO)] if modelzoo else []
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*first, str(REPO), *rest])}


def _python(*args: str, cwd: pathlib.Path, modelzoo: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=_env(modelzoo=modelzoo))


def _cerebrax(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    out = _python("-m", "cerebrax", *map(str, args), cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _params_v1(**runconfig) -> dict:
    """A Model Zoo params file of the sectioned layout (fc_mnist's shape)."""
    return {
        "train_input": dict(TRAIN),
        "eval_input": dict(EVAL),
        "model": {**MODEL, "mixed_precision": True},
        "optimizer": {"optimizer_type": "SGD", "learning_rate": LR, "momentum": MOMENTUM},
        "runconfig": {"max_steps": STEPS, "log_steps": 1, "seed": 1, "backend": "CPU",
                      "save_initial_checkpoint": True, "eval_frequency": STEPS,
                      "model_dir": "./run", **runconfig},
    }  # fmt: skip


def _params_v2() -> dict:
    """The same job in the trainer: layout."""
    return {
        "trainer": {
            "init": {
                "backend": {"backend_type": "CPU"},
                "model_dir": "./run",
                "seed": 1,
                "model": dict(MODEL),
                "optimizer": {"SGD": {"lr": LR, "momentum": MOMENTUM}},
                "loop": {"max_steps": STEPS, "eval_frequency": STEPS},
                "checkpoint": {"save_initial_checkpoint": True},
                "logging": {"log_steps": 1},
            },
            "fit": {"train_dataloader": dict(TRAIN), "val_dataloader": dict(EVAL)},
        }
    }  # fmt: skip


# Torch eager: the fake model from checkpoint_0 trained STEPS steps with torch's SGD on the
# data processor's batches; then the evaluation of checkpoint_<STEPS> (loss and accuracy
# from the logits, not through the model's metric), and the largest relative difference
# between the eager weights and checkpoint_<STEPS>'s.
REFERENCE = """
import itertools, json, sys
import numpy as np, torch
import torch.nn.functional as F
import cerebrax
cerebrax.enable_cstorch_alias()  # the fake model imports cerebras.pytorch, as Model Zoo's do
from cerebras.modelzoo.models.tiny import (TinyDataConfig, TinyDataProcessor, TinyModel,
                                           TinyModelConfig)

job = json.loads(sys.argv[1])
model = TinyModel(TinyModelConfig(**job["model"]))

def checkpoint(step):
    state = cerebrax.load(f"run/checkpoint_{step}.mdl")["model"]
    return {k: torch.as_tensor(np.asarray(v)) for k, v in state.items()}

model.load_state_dict(checkpoint(0))
optimizer = torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=job["momentum"])
losses = []
data = TinyDataProcessor(TinyDataConfig(**job["train"])).create_dataloader()
for batch in itertools.islice(data, job["steps"]):
    loss = model(batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
trained = checkpoint(job["steps"])
weights = max(float(((p - trained[k]).abs().max() / trained[k].abs().max()))
              for k, p in model.state_dict().items())
model.load_state_dict(trained)
batches = list(TinyDataProcessor(TinyDataConfig(**job["eval"])).create_dataloader())
with torch.no_grad():
    logits = [model.net(x) for x, _ in batches]
eval_loss = float(np.mean([F.cross_entropy(z, y).item() for z, (_, y) in zip(logits, batches)]))
right = torch.cat([z.argmax(-1) == y for z, (_, y) in zip(logits, batches)])
print(json.dumps({"losses": losses, "weights": weights, "eval_loss": eval_loss,
                  "accuracy": right.float().mean().item(), "eval_steps": len(batches)}))
"""


def _reference(tmp_path: pathlib.Path) -> dict:
    job = {"model": MODEL, "train": TRAIN, "eval": EVAL, "lr": LR, "momentum": MOMENTUM,
           "steps": STEPS}
    out = _python("-c", REFERENCE, json.dumps(job), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _losses(stdout: str) -> list[float]:
    found = {int(s): float(v) for s, v in re.findall(r"^step\s+(\d+)\s+loss (\S+)$", stdout, re.M)}
    assert sorted(found) == list(range(1, STEPS + 1)), stdout
    return [found[s] for s in sorted(found)]


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_fit_trains_the_registry_model_as_torch_eager_does(tmp_path, layout):
    """The losses of `cerebrax fit` equal a torch eager loop of the same model, data and
    optimizer from the same initial weights (float32), and so do the trained weights.
    The validation after the last step (eval_frequency) reports the model's own metric,
    equal to torch's accuracy; `cerebrax eval` of the last checkpoint prints the same."""
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(_params_v1() if layout == "v1" else _params_v2()))
    fit = _cerebrax("fit", path, cwd=tmp_path)
    want = _reference(tmp_path)
    np.testing.assert_allclose(_losses(fit.stdout), want["losses"], rtol=1e-5)
    assert want["weights"] < 1e-5
    eval_line = rf"^step\s+{STEPS}\s+eval loss (\S+)\s+accuracy (\S+)\s+\((\d+) steps\)$"
    loss, accuracy, steps = re.search(eval_line, fit.stdout, re.M).groups()
    assert int(steps) == want["eval_steps"] == EVAL["num_batches"]
    # Printed with 6 decimals.
    np.testing.assert_allclose(float(loss), want["eval_loss"], rtol=1e-5, atol=5e-7)
    np.testing.assert_allclose(float(accuracy), want["accuracy"], rtol=0, atol=5e-7)
    if layout == "v1":
        evaluated = _cerebrax("eval", path, cwd=tmp_path)
        assert re.search(rf"^eval loss {re.escape(loss)}\s+\({steps} steps\)$",
                         evaluated.stdout, re.M), evaluated.stdout
        assert re.search(rf"^eval accuracy {re.escape(accuracy)}$", evaluated.stdout, re.M)


# Runs `cerebrax.cli.main(argv)` for each argv of argv[1] (JSON) in one process (each on a
# fresh cerebrax: one backend per run) and prints [[exit status, stderr], ...] as JSON.
DRIVER = """
import contextlib, io, json, sys
import cerebrax
from cerebrax.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    cerebrax.reset()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""

# (config, arguments after the config path, what stderr says). Every case exits 2 with
# one message and no traceback.
REFUSED = [
    ("v1", ["model.not_a_key=1"],
     "model.not_a_key is not a known key; model takes name, hidden, compute_eval_metrics\n"
     "(checked by Model Zoo's TinyModelConfig"),
    ("v1", ["model.hidden=many"], "model.hidden: Input should be a valid integer"),
    ("v1", ["model.loss=cross_entropy"], "model.loss is not a known key"),
    ("v1", ["model.name=no_such_model"],
     "model.name: 'no_such_model' is not a model of Model Zoo's registry. It has: "
     "tiny_mlp, tiny_mlp_unused."),
    ("v1", ["train_input.data_processor=NoSuchProcessor"],
     "train_input.data_processor: 'NoSuchProcessor' is not a data processor of Model Zoo's "
     "'tiny_mlp' (model.name); it has: TinyDataProcessor."),
    ("v1", ["eval_input.not_a_key=1"],
     "eval_input.not_a_key is not a known key; eval_input takes data_processor, batch_size, "
     "num_batches, split"),
    ("v1", ["eval_input.split=test"], "eval_input.split: Input should be 'train' or 'val'"),
    ("v1", ["metrics=[accuracy]"], "metrics: a Model Zoo model computes its loss"),
    ("v1", ["model.compression={}"],
     "model.compression: Model Zoo applies this key with its WeightCompression callback"),
    ("v1", ["train_input.micro_batch_size=2"],
     "train_input.micro_batch_size: Model Zoo applies this key with its ScopedTrainFlags"),
    ("v1", ["model.factory=pkg.mod:fn"],
     "model: factory and name both say which model to build; give one"),
    ("v1", ["train_input.input_fn=pkg.mod:fn"],
     "train_input: input_fn and data_processor both say where the batches come from"),
    ("v2", ["trainer.init.model.not_a_key=1"],
     "trainer.init.model.not_a_key is not a known key; trainer.init.model takes name"),
    ("v2", ["trainer.fit.val_dataloader.batch_size=0.5"],
     "trainer.fit.val_dataloader.batch_size: Input should be a valid integer"),
    ("factory", [],
     "train_input.data_processor: Model Zoo lists the data processors of each of its "
     "models, and model names no Model Zoo model"),
]  # fmt: skip


def _configs(tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
    factory = _params_v1()
    factory["model"] = {"factory": f"{PARTS}:mlp", "hidden": 16}
    paths = {}
    for name, config in (("v1", _params_v1()), ("v2", _params_v2()), ("factory", factory)):
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(config))
    return paths


def _drive(tmp_path: pathlib.Path, argvs: list[list[str]], *, modelzoo: bool) -> list:
    out = _python("-c", DRIVER, json.dumps(argvs), cwd=tmp_path, modelzoo=modelzoo)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_model_zoo_keys_are_checked_by_its_config_classes(tmp_path):
    """Each key of the model and data sections goes to Model Zoo's config class, which
    refuses what it does not take; a name the registry lacks lists those it has. The
    errors come before anything is written, and `cerebrax validate` of the good config
    traces both steps."""
    paths = _configs(tmp_path)
    argvs = [["validate", str(paths["v1"]), "--model_dir", "validated"],
             ["validate", str(paths["v1"]), "--model_dir", "validated", "--mode", "eval"]]
    argvs += [["fit", str(paths[config]), *args] for config, args, _ in REFUSED]
    (validate, validate_eval, *results) = _drive(tmp_path, argvs, modelzoo=True)
    assert validate[0] == 0 and validate_eval[0] == 0, (validate, validate_eval)
    for (config, args, message), (code, err) in zip(REFUSED, results):
        assert code == 2 and message in err, (config, args, err)
        assert "Traceback" not in err and err.count("error:") == 1, err
    assert not (tmp_path / "run").exists()  # the refused runs wrote nothing


def test_without_model_zoo_the_error_names_what_to_install(tmp_path):
    paths = _configs(tmp_path)
    results = _drive(tmp_path, [["fit", str(paths["v1"])], ["fit", str(paths["factory"])]],
                     modelzoo=False)
    for (code, err), (key, alternative) in zip(results, [
        ("model.name: cerebrax has no model registry of its own", "model.factory:\n"),
        ("train_input.data_processor: cerebrax has no data-processor registry of its own",
         "train_input.input_fn:\n"),
    ]):  # fmt: skip
        assert code == 2 and err.startswith(f"cerebrax fit: error: {key}"), err
        assert "Model Zoo is not installed" in err
        assert "pip install --no-deps -e ./modelzoo" in err and alternative in err
        assert "Traceback" not in err
