"""Seed 002's Estimator workflow: train / evaluate / compile, checkpoints, and its rules.

The reference for every Estimator run is the equivalent ``@cstorch.trace`` loop on the
same model, optimizer and data; each of seed 002's rules has a test of its message.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re

import chex
import numpy as np
import pytest
import torch
from helpers import batches, mlp_apply, mlp_params, xent, xent_step

import cerebrax as cstorch
import torch_bridge
from cerebrax.errors import ConfigError
from cerebrax.estimator import Estimator, EstimatorSpec, ModeKeys, RunConfig

DATA = batches(n=30)  # 30 batches of 32: the input function repeats them


def input_fn(params):
    return DATA[: params["num_batches"]]


PARAMS = {"num_batches": 30, "lr": 0.1}


class Run:
    """A model, its optimizer and metrics, and a model_fn over them (state first)."""

    def __init__(self, seed=0):
        self.model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(seed)))
        self.optimizer = cstorch.optim.SGD(self.model.parameters(), lr=PARAMS["lr"],
                                           momentum=0.9)
        self.accuracy = cstorch.metrics.AccuracyMetric("accuracy")
        self.losses = []
        self.record = cstorch.step_closure(lambda loss: self.losses.append(float(loss)))

    def model_fn(self, features, labels, mode, params):
        logits = self.model(features)
        loss = xent(logits, labels)
        if mode == ModeKeys.TRAIN:
            self.record(loss)
            return EstimatorSpec(mode, loss=loss, optimizer=self.optimizer)
        self.accuracy(labels=labels, predictions=logits.argmax(-1))
        return EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": self.accuracy, "mean_logit": logits.mean()})


def trace_losses(order):
    """The reference: a @cstorch.trace loop over the batches ``DATA[i] for i in order``."""
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=PARAMS["lr"], momentum=0.9)
    training_step = xent_step(model, optimizer, zero_grad=True)

    losses = [float(training_step(*DATA[i])) for i in order]
    cstorch.reset()
    return np.array(losses)


def eval_reference(model, steps):
    """Loss, accuracy and mean logit of the model's current weights, by hand."""
    flat = model.state_dict()
    params = {layer: {"weight": flat[f"{layer}.weight"], "bias": flat[f"{layer}.bias"]}
              for layer in ("fc1", "fc2")}
    losses, hits, means = [], [], []
    for x, y in DATA[:steps]:
        logits = mlp_apply(params, x)
        losses.append(float(xent(logits, y)))
        hits.append(np.asarray(logits.argmax(-1) == y))
        means.append(float(logits.mean()))
    return np.mean(losses), np.concatenate(hits).mean(), np.mean(means)


def test_train_evaluate_compile_round_trip_matches_the_trace_loop(tmp_path, compiles):
    # Each train() call starts a new pass over the input function's data (as a new
    # TensorFlow input pipeline does), so the second call's batches are DATA[0:15].
    reference = trace_losses(list(range(25)) + list(range(15)))
    model_dir = str(tmp_path / "model_dir")
    config = RunConfig(save_checkpoints_steps=10, keep_checkpoint_max=2)

    run = Run()
    estimator = Estimator(run.model_fn, model_dir=model_dir, params=PARAMS, config=config)

    # compile first, as seed 002 suggests: validate_only traces the model code and
    # compiles nothing; compile() compiles the step and writes its artifacts; neither runs.
    weights = run.model.state_dict()
    before = compiles.count
    assert estimator.compile(input_fn, validate_only=True) is None
    assert compiles.count == before
    directory = estimator.compile(input_fn)
    assert compiles.count == before + 1
    assert os.path.getsize(os.path.join(directory, "estimator_train_step.hlo.txt")) > 0
    with open(os.path.join(directory, "estimator_train_step.memory.txt")) as f:
        assert "compile_seconds" in f.read()
    assert estimator.global_step == 0 and run.losses == []
    chex.assert_trees_all_equal(run.model.state_dict(), weights)
    assert not any(name.endswith(".mdl") for name in os.listdir(model_dir))

    estimator.train(input_fn, steps=25)
    estimator.train(input_fn, max_steps=40)  # 15 more
    assert estimator.global_step == 40
    np.testing.assert_allclose(run.losses, reference, rtol=1e-6)
    # Checkpoints every 10 steps of a train() call and at its end; the last 2 kept.
    assert sorted(n for n in os.listdir(model_dir) if n.endswith(".mdl")) == [
        "checkpoint_35.mdl", "checkpoint_40.mdl"]

    results = estimator.evaluate(input_fn, steps=6)
    loss, accuracy, mean_logit = eval_reference(run.model, 6)
    assert results["global_step"] == 40
    assert results["loss"] == pytest.approx(loss, rel=1e-6)
    assert results["accuracy"] == pytest.approx(accuracy, rel=1e-6)
    assert results["mean_logit"] == pytest.approx(mean_logit, rel=1e-5, abs=1e-7)
    # Metrics restart with every evaluate().
    assert estimator.evaluate(input_fn, steps=6)["accuracy"] == pytest.approx(accuracy)


def test_a_new_estimator_resumes_from_model_dir(tmp_path):
    # Steps 20..29 run in a second train() call: they see DATA[0:10] again.
    reference = trace_losses(list(range(20)) + list(range(10)))
    model_dir = str(tmp_path / "model_dir")
    run = Run()
    estimator = Estimator(run.model_fn, model_dir=model_dir, params=PARAMS)
    estimator.train(input_fn, steps=20)
    evaluated = estimator.evaluate(input_fn, steps=3)

    cstorch.reset()  # a new process: fresh objects, other initial weights
    resumed = Run(seed=7)
    estimator = Estimator(resumed.model_fn, model_dir=model_dir, params=PARAMS)
    again = estimator.evaluate(input_fn, steps=3)  # evaluates the latest checkpoint
    assert again == pytest.approx(evaluated, rel=1e-6)
    assert again["global_step"] == 20
    # Training resumes the weights and the momentum, and the global step.
    estimator.train(input_fn, steps=10)
    np.testing.assert_allclose(resumed.losses, reference[20:], rtol=1e-6)
    assert estimator.global_step == 30


def test_a_bridged_torch_module_trains_like_the_trace_loop(tmp_path):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(8, 16)
            self.fc2 = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))

    def build():
        torch.manual_seed(0)
        module = Net()
        compiled = cstorch.compile(module)
        optimizer = cstorch.optim.AdamW(module.parameters(), lr=0.01)
        return compiled, optimizer, torch_bridge.convert(torch.nn.CrossEntropyLoss())

    compiled, optimizer, loss_fn = build()
    training_step = xent_step(compiled, optimizer, loss_fn, zero_grad=True)

    expected = [float(training_step(*DATA[i])) for i in range(12)]
    cstorch.reset()

    compiled, optimizer, loss_fn = build()
    losses = []
    record = cstorch.step_closure(lambda loss: losses.append(float(loss)))

    def model_fn(features, labels, mode, params):
        loss = loss_fn(compiled(features), labels)
        record(loss)
        return EstimatorSpec(mode, loss=loss, optimizer=optimizer)

    Estimator(model_fn, model_dir=str(tmp_path), params=PARAMS).train(input_fn, steps=12)
    np.testing.assert_allclose(losses, expected, rtol=1e-6)


# ---- seed 002's rules, each with its message ------------------------------------------------


def simple_estimator(tmp_path, model_fn=None, **kwargs):
    run = Run()
    return Estimator(model_fn or run.model_fn, model_dir=str(tmp_path), params=PARAMS,
                     **kwargs), run


def test_input_must_yield_features_and_labels(tmp_path):
    estimator, _ = simple_estimator(tmp_path)
    features_only = lambda params: [x for x, _ in DATA]  # noqa: E731
    with pytest.raises(ConfigError, match="must be structured to consist of features and "
                       "labels(?s:.*)Batch 0 is a ndarray"):
        estimator.train(features_only, steps=2)
    three = lambda params: [(x, y, y) for x, y in DATA]  # noqa: E731
    with pytest.raises(ConfigError, match="Batch 0 is a tuple of 3"):
        estimator.train(three, steps=2)


def test_input_function_must_return_a_dataset(tmp_path):
    estimator, _ = simple_estimator(tmp_path)
    one_batch = lambda params: DATA[0]  # noqa: E731 - a (features, labels) pair
    with pytest.raises(ConfigError, match="Input function must return a dataset"):
        estimator.train(one_batch, steps=2)
    with pytest.raises(ConfigError, match="Input function must return a dataset"):
        estimator.evaluate(lambda params: None, steps=2)


def test_input_function_takes_the_single_params_dict(tmp_path):
    estimator, _ = simple_estimator(tmp_path)

    def two_args(params, mode):
        return DATA

    with pytest.raises(ConfigError, match="only takes a single dictionary parameter, params"):
        estimator.train(two_args, steps=2)
    seen = []
    estimator.train(lambda params: seen.append(params) or DATA, steps=1)
    assert seen[0] == PARAMS


def test_batches_must_have_a_fixed_size_naming_drop_remainder(tmp_path):
    estimator, _ = simple_estimator(tmp_path)
    ragged = DATA[:3] + [(DATA[3][0][:20], DATA[3][1][:20])]
    with pytest.raises(ConfigError, match=r"Inconsistent batch sizes detected: batch 3 has "
                       r"batch size 20, the first batch had 32(?s:.*)`drop_remainder=True`"):
        estimator.train(lambda params: ragged, steps=5)

    def torch_input_fn(params):
        x, y = np.concatenate([x for x, _ in DATA[:2]]), np.concatenate([y for _, y in DATA[:2]])
        dataset = torch.utils.data.TensorDataset(torch.as_tensor(x[:50]), torch.as_tensor(y[:50]))
        return torch.utils.data.DataLoader(dataset, batch_size=32, drop_last=False)

    with pytest.raises(ConfigError, match="drop_remainder=True"):
        estimator.train(torch_input_fn, steps=3)


def test_the_dataset_must_repeat_until_the_steps_are_done(tmp_path):
    estimator, _ = simple_estimator(tmp_path)
    once = lambda params: (batch for batch in DATA[:4])  # noqa: E731 - a one-shot generator
    with pytest.raises(ConfigError, match=r"ran out after 4 batches, before the run's 6\s+"
                       r"steps(?s:.*)repeat"):
        estimator.train(once, steps=6)
    with pytest.raises(ConfigError, match="needs the number of steps"):
        estimator.train(input_fn)


def test_hooks_are_rejected(tmp_path):
    run = Run()

    def model_fn(features, labels, mode, params):
        spec = run.model_fn(features, labels, mode, params)
        spec.training_hooks = [object()]
        return spec

    estimator, _ = simple_estimator(tmp_path, model_fn)
    with pytest.raises(ConfigError, match="Detected unsupported training_hooks(?s:.*)"
                       "does not support user-defined hooks(?s:.*)step_closure"):
        estimator.train(input_fn, steps=1)
    estimator, _ = simple_estimator(tmp_path)
    with pytest.raises(ConfigError, match=r"train\(hooks=...\) is not supported"):
        estimator.train(input_fn, steps=1, hooks=[object()])
    with pytest.raises(ConfigError, match=r"evaluate\(hooks=...\) is not supported"):
        estimator.evaluate(input_fn, steps=1, hooks=[object()])


def test_eval_metric_ops_in_a_cs_system_training_run_are_rejected(tmp_path):
    cstorch.backend("CSX")
    run = Run()

    def model_fn(features, labels, mode, params):
        spec = run.model_fn(features, labels, mode, params)
        spec.eval_metric_ops = {"mean_label": labels.mean()}
        return spec

    estimator = Estimator(model_fn, model_dir=str(tmp_path), params=PARAMS)
    with pytest.raises(ConfigError, match="Detected unsupported eval_metric_ops in CS system "
                       "training run"):
        estimator.train(input_fn, steps=1)


def test_eval_metric_ops_in_a_cpu_training_run_are_allowed(tmp_path):
    run = Run()

    def model_fn(features, labels, mode, params):
        spec = run.model_fn(features, labels, mode, params)
        spec.eval_metric_ops = {"mean_label": labels.mean()}
        return spec

    Estimator(model_fn, model_dir=str(tmp_path), params=PARAMS).train(input_fn, steps=2)
    assert len(run.losses) == 2


@pytest.mark.parametrize("name", [
    "save_checkpoints_secs", "train_distribute", "device_fn", "protocol",
    "eval_distribute", "experimental_distribute", "experimental_max_worker_delay_secs"])
def test_unsupported_config_parameters_are_rejected(name, tmp_path):
    with pytest.raises(ConfigError, match=f"does not support the config parameter `{name}`"):
        RunConfig(**{name: 1})
    with pytest.raises(ConfigError, match=f"`{name}`"):
        Estimator(Run().model_fn, model_dir=str(tmp_path), config={name: 1})


def test_model_fn_contract_is_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"must take \(features, labels, mode, params\)"):
        Estimator(lambda features, labels: None, model_dir=str(tmp_path))
    run = Run()

    def logits_only(features, labels, mode, params):
        return run.model(features)

    estimator = Estimator(logits_only, model_dir=str(tmp_path), params=PARAMS)
    with pytest.raises(ConfigError, match="must return a cerebrax.estimator.EstimatorSpec"):
        estimator.train(input_fn, steps=1)

    def no_optimizer(features, labels, mode, params):
        return EstimatorSpec(mode, loss=xent(run.model(features), labels))

    with pytest.raises(ConfigError, match="optimizer="):
        Estimator(no_optimizer, model_dir=str(tmp_path), params=PARAMS).train(input_fn,
                                                                             steps=1)


def test_a_changed_batch_shape_between_calls_raises_recompile_error(tmp_path):
    estimator, _ = simple_estimator(tmp_path)
    estimator.train(input_fn, steps=1)
    smaller = [(x[:16], y[:16]) for x, y in DATA]
    with pytest.raises(cstorch.RecompileError, match=r"(?s)`features` with shape \(32, 8\)"):
        estimator.train(lambda params: smaller, steps=1)


def test_labels_may_be_none_and_evaluate_defaults_to_one_pass(tmp_path):
    run = Run()

    def model_fn(features, labels, mode, params):
        assert labels is None
        loss = (run.model(features) ** 2).mean()  # no labels needed
        return EstimatorSpec(mode, loss=loss, optimizer=run.optimizer)

    unlabelled = lambda params: [(x, None) for x, _ in DATA[:5]]  # noqa: E731
    estimator = Estimator(model_fn, model_dir=str(tmp_path), params=PARAMS)
    estimator.train(unlabelled, steps=3)
    assert estimator.evaluate(unlabelled)["global_step"] == 3  # one pass: 5 batches
    generator = lambda params: (batch for batch in DATA)  # noqa: E731 - no length
    with pytest.raises(ConfigError, match=r"evaluate\(steps=None\) evaluates one pass"):
        estimator.evaluate(generator)


def test_public_names():
    assert cstorch.estimator.Estimator is Estimator
    assert (ModeKeys.TRAIN, ModeKeys.EVAL) == ("train", "eval")
    for name in ("initialize", "module", "dataloader", "Session", "LazyTensor"):
        assert hasattr(cstorch.legacy, name), name


def test_the_docs_older_scripts_section_runs(capsys):
    """The "Older Cerebras scripts" snippets of docs/porting/cstorch.md run as written
    and learn."""
    readme = (pathlib.Path(__file__).parents[2] / "docs" / "porting" / "cstorch.md").read_text()
    section = readme.split("## Older Cerebras scripts", 1)[1].split("\n## ", 1)[0]
    session_code, estimator_code = re.findall(r"```python\n(.*?)```", section, re.S)

    namespace = {}
    exec(compile(session_code, "docs: Session", "exec"), namespace)
    epochs = re.findall(r"epoch \d: loss ([\d.]+)", capsys.readouterr().out)
    assert len(epochs) == 3 and all(float(loss) < 1.0 for loss in epochs)  # chance: 1.39
    assert namespace["session"].num_compiles == 1
    x, y = namespace["dataset"].tensors
    predictions = np.asarray(namespace["model"](x)).argmax(1)  # outside: runs right away
    assert (predictions == y.numpy()).mean() > 0.9

    cstorch.reset()
    namespace = {"cstorch": cstorch}  # imported by the page's block before
    exec(compile(estimator_code, "docs: Estimator", "exec"), namespace)
    results = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])
    assert results == namespace["estimator"].evaluate(namespace["input_fn"], steps=16)
    assert results["global_step"] == 100 and results["accuracy"] > 0.9
    assert os.path.exists("estimator_dir/checkpoint_100.mdl")
