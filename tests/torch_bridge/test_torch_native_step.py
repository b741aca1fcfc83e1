"""Torch code inside a traced step: seed 001's scripts with ``import cerebrax as cstorch``.

Inside ``@cstorch.trace`` the values torch code sees are torch tensors
(``torch_bridge.JaxTensor``): a torch loss module on the model's outputs,
``outputs.argmax(-1).int()``, ``loss.backward()``, ``torch.nn.utils.clip_grad_norm_`` on the
original module's parameters. Every test compares with torch eager on the same model and
data.

The seed's skeletons leave placeholders (``...``) for the model, the loss, the data and
the hyperparameters; they are filled in below and marked ``# FILL:``. Besides the import
line, the only edits to the seed's lines are marked ``# FIX:`` (typos that stop the
skeletons from running anywhere) and ``# HERE:`` (values chosen for a test).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import cerebrax as cstorch
from cerebrax.errors import TensorReadError

from seed001_parts import (BATCH, CLASSES, FEATURES, Classifier, eval_dataloader_fn,
                           train_dataloader_fn)
from helpers import CSTORCH_ADAMW

STEPS, LR = 30, 0.05


def seed001_training(checkpoint_path=None, backend="CPU"):
    """Seed 001's "Full Example (Training)"; its step is the seed's GradScaler sequence."""
    out = {"losses": [], "norms": []}

    # --- seed 001, "Full Example (Training)" -----------------------------------------
    # import torch
    # import cerebras_pytorch.experimental as cstorch   (here: import cerebrax as cstorch)

    # Needs to be run at the beginning before model initialization
    checkpoint_steps = 1  # HERE: the seed's 100; a 30-step run saves every step
    cstorch.configure(
        checkpoint_steps=checkpoint_steps,
        # FILL: `mgmt_address=..., ...`: no cluster to manage
    )

    # user defined model
    torch.manual_seed(0)
    model: torch.nn.Module = Classifier()  # FILL
    # HERE: the seed's backend="wse_ws" computes in float16 (the wafer's default); the
    # comparison with float32 torch eager to 1e-5 runs on "CPU" (and the test on the
    # wafer backend passes "wse_ws").
    compiled_model = cstorch.compile(model, backend=backend)

    loss_fn: torch.nn.Module = torch.nn.CrossEntropyLoss()  # FILL

    optimizer: cstorch.optim.Optimizer = cstorch.optim.configure_optimizer(
        optimizer_type="SGD",  # FILL
        params=model.parameters(),
        lr=LR,  # FILL
        momentum=0.9,  # FILL
    )
    lr_scheduler: cstorch.optim.lr_scheduler.LRScheduler = cstorch.optim.configure_lr_scheduler(
        optimizer, learning_rate=LR,  # FILL
    )

    loss_scale = "dynamic"  # FILL: the seed leaves `loss_scale` undefined
    grad_scaler = None
    if loss_scale != 0.0:
        grad_scaler = cstorch.amp.GradScaler(loss_scale=loss_scale)  # FILL

    @cstorch.step_closure
    def save_checkpoint(step):
        checkpoint_file = f"checkpoint_{step}.mdl"

        state_dict = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
        }
        if lr_scheduler:
            state_dict["lr_scheduler"] = lr_scheduler.state_dict()
        if grad_scaler:
            state_dict["grad_scaler"] = grad_scaler.state_dict()

        state_dict["global_step"] = step

        cstorch.save(state_dict, checkpoint_file)

    global_step = 0

    # Load checkpoint if provided
    if checkpoint_path is not None:
        state_dict = cstorch.load(checkpoint_path)

        model.load_state_dict(state_dict["model"])
        optimizer.load_state_dict(state_dict["optimizer"])
        if lr_scheduler:
            lr_scheduler.load_state_dict(state_dict["lr_scheduler"])
        if grad_scaler:
            grad_scaler.load_state_dict(state_dict["grad_scaler"])

        global_step = state_dict.get("global_step", 0)

    dataloader = cstorch.utils.data.DataLoader(
        train_dataloader_fn,
        num_steps=STEPS,  # HERE: the seed's 1000
        batch_size=BATCH,  # FILL: the argument of train_dataloader_fn
    )

    @cstorch.step_closure
    def post_clip(norm: torch.Tensor):  # FILL: keeps the clip norm for the checks
        out["norms"].append(norm.item())

    @cstorch.compile_step
    def training_step(batch):
        inputs, targets = batch
        outputs = compiled_model(inputs)
        loss = loss_fn(outputs, targets)

        # FILL: the step as in the seed's "Using Gradient Scaling" section
        optimizer.zero_grad()
        # Scale the loss before calling the backward pass
        grad_scaler.scale(loss).backward()

        # Unscales the gradients of optimizer's assigned params in-place
        # to facilitate things like gradient clipping
        grad_scaler.unscale_(optimizer)

        # Global gradient clipping
        norm = torch.nn.utils.clip_grad_norm_(
            model.parameters(),
            1.0,  # max gradient norm
        )
        post_clip(norm)

        # Step the optimizer using the grad scaler
        grad_scaler.step(optimizer)

        # update the grad scaler once all optimizers have been stepped
        grad_scaler.update()

        return loss

    @cstorch.step_closure
    def post_training_step(loss: torch.Tensor):
        print("Loss: ", loss.item())
        out["losses"].append(loss.item())  # FILL: kept for the checks

    for i, batch in enumerate(dataloader):
        loss = training_step(batch)  # FIX: the seed passes `dataloader`, a typo

        post_training_step(loss)

        # Can only save checkpoint on predetermined steps
        if i % checkpoint_steps == 0:
            save_checkpoint(i)
    # --- end of the seed ---------------------------------------------------------------

    out.update(model=model, step=training_step, global_step=global_step)
    return out


def torch_eager_training():
    """The same training in torch eager: losses, clip norms and the trained model."""
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses, norms = [], []
    for step, (inputs, targets) in enumerate(train_dataloader_fn(BATCH)):
        if step == STEPS:
            break
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
        optimizer.step()
        losses.append(loss.item())
    return losses, norms, model


def assert_rel_close(actual, expected, rtol=1e-5, what=""):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    rel = np.abs(actual - expected) / np.maximum(np.abs(expected), 1e-12)
    assert rel.max() <= rtol, f"{what}: max rel. difference {rel.max():.2e}"


def test_seed_training_with_the_grad_scaler_sequence_equals_torch_eager(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = seed001_training()
    losses, norms, reference = torch_eager_training()

    assert len(run["losses"]) == STEPS and len(run["norms"]) == STEPS
    assert_rel_close(run["losses"], losses, what="losses")
    assert_rel_close(run["norms"], norms, what="clip norms")
    assert max(norms) > 1.0  # the clipping acted
    trained, expected = run["model"].state_dict(), reference.state_dict()
    assert list(trained) == list(expected)
    for name in expected:  # relative to each tensor's largest entry
        a, b = trained[name].numpy(), expected[name].numpy()
        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), name
    assert run["step"].num_compiles == 1
    # No tensor of the traced step is left on the user's module.
    assert all(p.grad is None for p in run["model"].parameters())


def test_seed_training_on_the_wafer_backend(tmp_path, monkeypatch):
    """The seed's own backend="wse_ws" (float16 compute, dynamic loss scaling) trains."""
    monkeypatch.chdir(tmp_path)
    run = seed001_training(backend="wse_ws")
    losses, _, _ = torch_eager_training()
    assert np.mean(run["losses"][-5:]) < 0.7 * np.mean(run["losses"][:5])
    # float16 compute: close to float32 torch, not equal.
    assert_rel_close(run["losses"][:5], losses[:5], rtol=2e-2, what="first losses")
    assert run["step"].num_compiles == 1


def test_loss_backward_clip_step_zero_grad_equals_torch_eager():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, CLASSES))
    reference = copy.deepcopy(model)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    batches = list(train_dataloader_fn(BATCH))[:12]

    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, **CSTORCH_ADAMW)
    expected = []
    for inputs, targets in batches:
        loss = loss_fn(reference(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        ref_opt.step()
        ref_opt.zero_grad()
        expected.append(loss.item())

    compiled = cstorch.compile(model, "CPU")
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2)

    @cstorch.trace
    def step(inputs, targets):
        loss = loss_fn(compiled(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    losses = [float(step(inputs, targets)) for inputs, targets in batches]
    assert_rel_close(losses, expected, what="losses")
    assert step.num_compiles == 1


def test_gradients_are_torch_tensors_after_backward():
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, CLASSES)
    reference = copy.deepcopy(model)
    inputs, targets = next(iter(train_dataloader_fn(BATCH)))
    torch.nn.functional.cross_entropy(reference(inputs), targets).backward()
    expected = {n: (p.grad * 0.5).clamp(-0.01, 0.01) for n, p in reference.named_parameters()}

    compiled = cstorch.compile(model, "CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1.0)
    seen = {}

    @cstorch.trace
    def step(inputs, targets):
        torch.nn.functional.cross_entropy(compiled(inputs), targets).backward()
        for p in model.parameters():
            seen[id(p)] = type(p.grad)
            p.grad.mul_(0.5)  # in place, as torch code does
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)
        optimizer.step()  # lr 1: the update is the changed gradient

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    step(inputs, targets)
    after = model.state_dict()
    for name, grad in expected.items():
        np.testing.assert_allclose(before[name] - after[name], grad, rtol=1e-5, atol=1e-7)
    assert all(issubclass(t, torch.Tensor) for t in seen.values()) and len(seen) == 2


@pytest.mark.parametrize("feed", ["torch", "streamed", "numpy"])
def test_a_torch_model_returns_what_it_was_given(feed):
    """Like in, like out: torch inputs (passed directly or streamed from a torch
    DataLoader) reach the step as torch tensors of their dtype, and the model returns
    torch tensors for a torch loss; numpy inputs stay JAX arrays and the model returns
    JAX arrays for a JAX loss. Both give torch eager's loss."""
    import jax.numpy as jnp
    import optax

    torch.manual_seed(1)
    model = torch.nn.Linear(FEATURES, CLASSES)
    inputs, targets = next(iter(train_dataloader_fn(BATCH)))
    expected = torch.nn.functional.cross_entropy(model(inputs), targets).item()
    compiled = cstorch.compile(model, "CPU")
    seen = {}

    @cstorch.trace
    def step(x, y):
        outputs = compiled(x)
        seen.update(x=type(x), y=getattr(y, "dtype", None), outputs=type(outputs))
        if isinstance(outputs, torch.Tensor):
            return torch.nn.functional.cross_entropy(outputs, y)
        return optax.softmax_cross_entropy_with_integer_labels(outputs, y).mean()

    if feed == "streamed":
        loader = cstorch.utils.data.DataLoader(lambda: [(inputs, targets)], num_steps=1)
        (loss,) = [step(x, y) for x, y in loader]
    elif feed == "torch":
        loss = step(inputs, targets)
    else:
        loss = step(inputs.numpy(), targets.numpy())
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    if feed == "numpy":
        assert not issubclass(seen["x"], torch.Tensor), seen
        assert not issubclass(seen["outputs"], torch.Tensor), seen
        assert seen["y"] == jnp.int32
    else:
        assert issubclass(seen["x"], torch.Tensor) and seen["y"] == torch.int64, seen
        assert issubclass(seen["outputs"], torch.Tensor), seen


def test_seed_evaluation_as_written_gives_torch_accuracy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(1)
    trained = Classifier()
    cstorch.save({"model": trained.state_dict()}, "trained.mdl")
    # torch's own numbers on the same data
    correct, total_loss_ref, batches = 0, 0.0, 0
    with torch.no_grad():
        for inputs, targets in eval_dataloader_fn(BATCH):
            outputs = trained(inputs)
            correct += int((outputs.argmax(-1) == targets).sum())
            total_loss_ref += torch.nn.CrossEntropyLoss()(outputs, targets).item()
            batches += 1
    accuracy_ref = correct / (batches * BATCH)

    namespace = {"eval_dataloader_fn": eval_dataloader_fn, "Classifier": Classifier}
    exec(compile(SEED_EVALUATION, "seed001_evaluation", "exec"), namespace)

    assert namespace["total_steps"] == batches
    assert float(namespace["accuracy"]) == pytest.approx(accuracy_ref, abs=1e-7)
    assert namespace["total_loss"] == pytest.approx(total_loss_ref, rel=1e-5)
    assert namespace["evaluation_step"].num_compiles == 1


# Seed 001's "Full Example (Evaluation)", run as a script.
SEED_EVALUATION = '''
import torch
import cerebrax as cstorch                     # the seed: cerebras_pytorch.experimental
import cerebrax.metrics as metrics             # the seed: cerebras_pytorch.experimental.metrics


cstorch.configure()                           # FILL: the seed's mgmt_address=...

model: torch.nn.Module = Classifier()         # FILL
compiled_model = cstorch.compile(model, backend="CPU")  # HERE: the seed's "wse_ws" (float16)
compiled_model.eval()

loss_fn: torch.nn.Module = torch.nn.CrossEntropyLoss()  # FILL

accuracy = metrics.AccuracyMetric("accuracy", compute_on_system=True)

state_dict = cstorch.load("trained.mdl")      # FILL: "<path to checkpoint file>"
model.load_state_dict(state_dict["model"])

dataloader = cstorch.utils.data.DataLoader(
    eval_dataloader_fn,
    num_steps=16,                             # HERE: the seed's 100 (256 points)
    batch_size=16,                            # FILL: the argument of eval_dataloader_fn
)

@cstorch.compile_step
def evaluation_step(batch):
    inputs, targets = batch
    outputs = compiled_model(inputs)
    loss = loss_fn(outputs, targets)

    accuracy(
        labels=targets.clone(),
        predictions=outputs.argmax(-1).int(),
    )

    return loss

total_loss = 0
total_steps = 0

@cstorch.step_closure
def post_eval_step(loss: torch.Tensor):
    global total_loss
    global total_steps                        # FIX: missing in the seed (UnboundLocalError)

    total_loss += loss.item()
    total_steps += 1


with torch.no_grad():
    for batch in dataloader:
        loss = evaluation_step(batch)

        post_eval_step(loss)

print(f"Eval Accuracy: {float(accuracy)}")    # FIX: the seed has one ")" too many
'''


def test_a_closure_receives_torch_tensors():
    torch.manual_seed(0)
    compiled = cstorch.compile(torch.nn.Linear(FEATURES, CLASSES), "CPU")
    loss_fn = torch.nn.CrossEntropyLoss()
    got = []

    @cstorch.step_closure
    def check(loss, predictions, labels, plain):
        got.append((type(loss), bool(torch.isnan(loss)), loss.item(), predictions.dtype,
                    labels.dtype, type(plain)))

    @cstorch.trace
    def step(inputs, targets):
        outputs = compiled(inputs)
        loss = loss_fn(outputs, targets)
        check(loss, outputs.argmax(-1), targets, loss.__jax_array__() * 2)
        return loss

    inputs, targets = next(iter(train_dataloader_fn(BATCH)))
    loss = step(inputs, targets)
    (loss_type, isnan, value, predictions, labels, plain), = got
    assert loss_type is torch.Tensor and not isnan
    assert value == pytest.approx(float(loss), rel=1e-6)
    assert predictions == torch.int64 and labels == torch.int64
    assert plain is np.ndarray  # a JAX value of the step stays a numpy array


def test_an_uncompiled_torch_module_in_the_step_is_a_constant():
    """A second torch module (a metric head) needs no compile and no torch_bridge.convert."""
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, CLASSES)
    head = torch.nn.Linear(CLASSES, 1)  # never compiled, no optimizer holds it
    reference_model, reference_head = copy.deepcopy(model), copy.deepcopy(head)
    compiled = cstorch.compile(model, "CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(inputs, targets):
        outputs = compiled(inputs)
        loss = torch.nn.functional.cross_entropy(outputs, targets) + head(outputs).pow(2).mean()
        loss.backward()
        optimizer.step()
        return loss

    ref_opt = torch.optim.SGD(reference_model.parameters(), lr=0.1)
    for inputs, targets in list(train_dataloader_fn(BATCH))[:3]:
        loss = step(inputs, targets)
        ref_loss = (torch.nn.functional.cross_entropy(reference_model(inputs), targets)
                    + reference_head(reference_model(inputs)).pow(2).mean())
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        assert float(loss) == pytest.approx(ref_loss.item(), rel=1e-5)
    torch.testing.assert_close(head.weight, reference_head.weight)  # untouched constant


def test_reading_a_torch_value_inside_the_step_raises():
    compiled = cstorch.compile(torch.nn.Linear(FEATURES, CLASSES), "CPU")

    @cstorch.trace
    def reads_item(inputs):
        return compiled(inputs).sum().item()

    @cstorch.trace
    def branches(inputs):
        loss = compiled(inputs).sum()
        if loss > 0:
            return loss
        return -loss

    inputs = torch.randn(BATCH, FEATURES)
    for step in (reads_item, branches):
        with pytest.raises(TensorReadError, match="step closure"):
            step(inputs)


def test_torch_errors_outside_and_inside_the_step_name_the_fix():
    from torch_bridge import JaxTensor

    from cerebrax.errors import ConfigError, UnsupportedOpError

    value = JaxTensor(np.ones(3, np.float32))
    with pytest.raises(UnsupportedOpError, match=r"inside a @cstorch.trace step"):
        value.sum().backward()  # outside a step there is no program to differentiate
    with pytest.raises(UnsupportedOpError, match="takes no gradient"):
        value.sum().backward(torch.ones(()))
    with pytest.raises(UnsupportedOpError, match="not part of the compiled step"):
        torch.ones(3).mul_(value)  # writing into a plain torch tensor
    with pytest.raises(TypeError, match="cannot be pickled"):
        import pickle

        pickle.dumps(value)
    with pytest.raises(ConfigError, match="compute_on_system=False"):
        cstorch.metrics.AccuracyMetric("acc", compute_on_system=False)
