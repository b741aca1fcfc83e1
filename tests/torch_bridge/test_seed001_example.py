"""Seed 001's "Full Example (Training)", run with ``import cerebrax as cstorch``.

``full_example`` below is the seed's skeleton as written, filled in with a small torch
model and a torch DataLoader over synthetic data. Every line that differs from the seed
is marked ``# CHANGE:``; the allowed changes are the loss module, the real model and
data, and the seed's values that need a real cluster (``mgmt_address``) or a long run.
Two more are needed to run the seed at all (a typo, and the checkpoint cadence), each
explained where it happens.

The tests then check what a user of the seed relies on: it trains, its step closure
writes checkpoints, a checkpoint loads back into a FRESH torch module that then predicts
what the compiled model predicts, and the seed's own "Load checkpoint if provided"
block resumes a fresh run from it.
"""

from __future__ import annotations

import glob
import types

import numpy as np
import pytest
import torch

import cerebrax as cstorch
from cerebrax.errors import StateError

from seed001_parts import BATCH, Classifier, synthetic_data, train_dataloader_fn


def full_example(checkpoint_path=None, num_steps=12, checkpoint_steps=1, seed=0):
    """The seed's Full Example (Training); returns its variables for the checks."""
    printed = []

    # --- from here on: seed 001, "Full Example (Training)" --------------------------
    # import torch
    # import cerebras_pytorch.experimental as cstorch
    # CHANGE: `import cerebrax as cstorch` (at the top of this file).

    # Needs to be run at the beginning before model initialization
    # CHANGE: the seed has `checkpoint_steps = 100`, saves when `i % checkpoint_steps
    # == 0` with a 0-based `i` (steps 0, 100, ...), and runs 1000 steps. Weights can be
    # fetched only on checkpoint steps, which are 0-based steps k-1, 2k-1, ... and the
    # last (as in cstorch); the seed's condition lands on them only with k = 1 (see
    # test_the_seed_condition_off_the_checkpoint_steps_is_refused). A short run.
    # checkpoint_steps = 100
    cstorch.configure(
        checkpoint_steps=checkpoint_steps,
        # CHANGE: `mgmt_address=...` dropped: no cluster to manage (cstorch.configure has
        # no such argument here), and `...` (the other defaults) is left as is.
    )

    # user defined model
    torch.manual_seed(seed)
    model: torch.nn.Module = Classifier()  # CHANGE: a real model
    compiled_model = cstorch.compile(model, backend="wse_ws")

    loss_fn: torch.nn.Module = torch.nn.CrossEntropyLoss()  # CHANGE: for "..."

    optimizer: cstorch.optim.Optimizer = cstorch.optim.configure_optimizer(
        optimizer_type="AdamW",  # CHANGE: real values for "..."
        params=model.parameters(),
        lr=0.01,
        weight_decay=0.01,
    )
    lr_scheduler: cstorch.optim.lr_scheduler.LRScheduler = cstorch.optim.configure_lr_scheduler(
        optimizer, learning_rate={  # CHANGE: a real schedule for "..."
            "scheduler": "LinearLR", "initial_learning_rate": 0.01,
            "end_learning_rate": 0.001, "total_iters": 1000,
        },
    )

    loss_scale = "dynamic"  # CHANGE: the seed leaves `loss_scale` undefined
    grad_scaler = None
    if loss_scale != 0.0:
        grad_scaler = cstorch.amp.GradScaler(loss_scale=loss_scale)  # CHANGE: for (...)

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
        num_steps=num_steps,  # CHANGE: the seed runs 1000 steps
        batch_size=BATCH,  # CHANGE: for "...", the argument of train_dataloader_fn
    )

    @cstorch.compile_step
    def training_step(batch):
        inputs, targets = batch
        outputs = compiled_model(inputs)
        loss = loss_fn(outputs, targets)

        cstorch.amp.optimizer_step(
            loss, optimizer, grad_scaler, max_gradient_norm=1.0
        )

        return loss

    @cstorch.step_closure
    def post_training_step(loss: torch.Tensor):
        print("Loss: ", loss.item())
        printed.append(loss.item())  # CHANGE: also kept, for the checks

    for i, batch in enumerate(dataloader):
        # CHANGE: the seed passes `dataloader` here, a typo for `batch`.
        loss = training_step(batch)

        post_training_step(loss)

        # Can only save checkpoint on predetermined steps
        if i % checkpoint_steps == 0:
            save_checkpoint(i)
    # --- end of the seed -----------------------------------------------------------

    return types.SimpleNamespace(model=model, compiled_model=compiled_model, losses=printed,
                                 global_step=global_step, optimizer=optimizer)


def _checkpoints():
    return sorted(glob.glob("checkpoint_*.mdl"), key=lambda p: int(p[11:-4]))


def test_seed_full_example_trains_and_its_checkpoint_loads_into_a_fresh_torch_module():
    run = full_example(num_steps=12)

    # It trained: one printed loss per step, falling.
    assert len(run.losses) == 12
    assert np.mean(run.losses[-3:]) < 0.8 * np.mean(run.losses[:3]), run.losses
    # The step closure wrote a checkpoint on every step (checkpoint_steps = 1).
    paths = _checkpoints()
    assert paths == [f"checkpoint_{i}.mdl" for i in range(12)]

    # The last checkpoint holds the compiled model's weights, under torch's names.
    state_dict = cstorch.load(paths[-1])
    assert state_dict["global_step"] == 11
    compiled_state = run.compiled_model.state_dict()
    assert list(state_dict["model"]) == list(Classifier().state_dict())
    for name, value in state_dict["model"].items():
        np.testing.assert_array_equal(np.asarray(value), compiled_state[name], err_msg=name)

    # A FRESH torch module (plain torch, never compiled) loads it. cstorch.load gives
    # lazy arrays; a plain torch module takes tensors.
    torch.manual_seed(123)
    fresh = Classifier()
    fresh.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in
                           state_dict["model"].items()})
    fresh.eval()
    run.model.eval()  # the original module's switch puts the compiled model in eval mode
    assert not run.compiled_model.training

    x, _ = synthetic_data(64, seed=1)
    with torch.no_grad():
        torch_logits = fresh(x).numpy()
    # The compiled model runs the wafer's mixed precision (float16 compute), so its
    # logits agree to float16 accuracy, and its predictions are the same.
    compiled_logits = np.asarray(run.compiled_model(x), np.float32)
    tolerance = 5e-3 * np.abs(torch_logits).max()
    np.testing.assert_allclose(compiled_logits, torch_logits, atol=tolerance)
    # Where the top two logits are further apart than twice that, the prediction
    # cannot differ: there it must be the same (that is nearly everywhere).
    top2 = np.sort(torch_logits, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * tolerance
    assert clear.mean() > 0.8
    np.testing.assert_array_equal(compiled_logits.argmax(1)[clear],
                                  torch_logits.argmax(1)[clear])
    # And the original module's own state dict is the same checkpoint.
    with torch.no_grad():
        for name, value in run.model.state_dict().items():
            np.testing.assert_array_equal(value.numpy(), fresh.state_dict()[name].numpy())


def test_the_seed_resumes_from_its_checkpoint_in_a_fresh_process_state():
    first = full_example(num_steps=6)
    last = _checkpoints()[-1]
    saved = cstorch.load(last, map_location="cpu")
    x, y = next(iter(train_dataloader_fn(BATCH)))  # the resumed run's first batch
    fresh = Classifier()
    fresh.load_state_dict({k: torch.as_tensor(v) for k, v in saved["model"].items()})
    with torch.no_grad():
        expected_first_loss = torch.nn.functional.cross_entropy(fresh(x), y).item()
    del first

    cstorch.reset()  # a new run: configure() again, a fresh module (another seed)
    resumed = full_example(checkpoint_path=last, num_steps=2, seed=7)
    assert resumed.global_step == 5
    # The fresh module's load_state_dict wrote the compiled state: the resumed run's
    # first loss is the checkpoint's loss on that batch (float16 compute on the wafer).
    assert resumed.losses[0] == pytest.approx(expected_first_loss, rel=2e-2)
    # The optimizer resumed too: AdamW's step count went on from 6.
    state = resumed.optimizer.state_dict()["state"]
    assert all(float(np.asarray(s["step"])) == 8 for s in state.values())


def test_the_seed_condition_off_the_checkpoint_steps_is_refused():
    # With the seed's checkpoint_steps = 100 (here 3), `i % checkpoint_steps == 0`
    # asks for the weights at step 0, which is not a checkpoint step: a clear error
    # points at checkpoint_closure instead of a silently stale checkpoint.
    with pytest.raises(StateError, match="checkpoint steps"):
        full_example(num_steps=6, checkpoint_steps=3)


def test_the_seed_typo_passing_the_dataloader_to_the_step_names_the_fix():
    # The seed calls `training_step(dataloader)` inside `for i, batch in ...`: the
    # step is told it got the loader, not a batch, and shown the loop that is meant.
    cstorch.configure(checkpoint_steps=1)
    compiled = cstorch.compile(Classifier(), backend="CPU")
    dataloader = cstorch.utils.data.DataLoader(train_dataloader_fn, num_steps=1,
                                               batch_size=BATCH)

    @cstorch.compile_step
    def training_step(batch):
        inputs, targets = batch
        return torch.nn.functional.cross_entropy(compiled(inputs), targets)

    for _ in dataloader:
        with pytest.raises(cstorch.errors.ConfigError,
                           match=r"given the DataLoader itself(.|\n)*training_step\(batch\)"):
            training_step(dataloader)
