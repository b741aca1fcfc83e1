"""A training program written the way Cerebras Model Zoo's Trainer uses cstorch, run by
tests/cli/test_trainer_style.py under ``cerebrax run`` and with ``--eager`` (plain torch
with torch.optim). It prints its losses, norms, validation loss and what it wrote as JSON.

What it exercises, as the Trainer does:
- config classes built with pydantic from ``inspect.signature`` of every
  ``cstorch.optim.Optimizer`` and LR scheduler subclass (``ParamsT`` and
  ``torch.optim.Optimizer`` mapped to defaults), validating ``{"SGD": {...}}``;
- ``cstorch.backend(BackendType.CPU)``, the model built under ``with backend.device``;
- a Trainer class whose ``training_step`` / ``validation_step`` are traced methods, with
  callbacks around the step: a norm callback accumulating ``torch.tensor(0.).to(
  model.device)`` in place, a loss logger in a step closure;
- a traced-tensor listener and a lazy-tensor transfer hook registered around the loops;
- the TensorBoard logger's ``add_scalar`` / ``add_text`` and its links to
  ``_get_file_writer().event_writer._file_name`` and ``cs_events_dir``;
- ``DataLoader.id`` naming the validation loader, ``DataExecutor(activation_steps=None)``
  with a ``Schedule`` of checkpoint steps, the initial checkpoint saved by a checkpoint
  closure before any executor exists, ``state_dict()["samples_streamed"]``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import pathlib
import sys
import typing

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--eager", action="store_true")
parser.add_argument("--out", type=pathlib.Path, required=True)
args = parser.parse_args()

STEPS, VAL_STEPS, BATCH = 4, 2, 4
LR, MOMENTUM = 0.05, 0.9


def make_batches(n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(BATCH, 6, generator=g),
             "y": torch.randint(0, 3, (BATCH,), generator=g)} for _ in range(n)]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)])

    def forward(self, batch):
        h = torch.relu(self.layers[0](batch["x"]))
        logits = self.layers[1](h)
        return {"loss": torch.nn.functional.cross_entropy(logits, batch["y"])}


def norms(model, device):
    """What Model Zoo's norm callback computes: the model-wise squared norm, per layer."""
    total = torch.tensor(0.0).to(device)
    per_layer = {}
    for name, p in model.named_parameters():
        total += torch.pow(torch.norm(p), 2.0)
        layer = name.split(".")[1]
        if layer not in per_layer:
            per_layer[layer] = torch.tensor(0.0).to(device)
        per_layer[layer] += torch.pow(torch.norm(p), 2.0)
    return torch.sqrt(total), torch.sqrt(per_layer["0"])


train_batches, val_batches = make_batches(STEPS, 1), make_batches(VAL_STEPS, 2)
result = {"train": [], "norm": [], "norm0": []}

if args.eager:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for batch in train_batches:
        loss = model(batch)["loss"]
        norm, norm0 = norms(model, "cpu")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        result["train"].append(loss.item())
        result["norm"].append(norm.item())
        result["norm0"].append(norm0.item())
    model.eval()
    with torch.no_grad():
        result["val"] = sum(model(b)["loss"].item() for b in val_batches) / VAL_STEPS
    args.out.write_text(json.dumps(result))
    sys.exit(0)

import pydantic  # noqa: E402

import cerebras.pytorch as cstorch  # noqa: E402
from cerebras.pytorch.backend import BackendType  # noqa: E402
from cerebras.pytorch.backend.ltc_backend import register_after_tensor_to_cpu  # noqa: E402
from cerebras.pytorch.experimental.listener import register_traced_tensor_hook  # noqa: E402
from cerebras.pytorch.optim.optimizer import ParamsT  # noqa: E402
from cerebras.pytorch.utils.tensorboard import SummaryWriter  # noqa: E402


# ---- config classes from signatures ------------------------------------------------------
def config_class(cls: type, mapping: dict) -> type:
    fields = {}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        annotation = typing.Any if p.annotation is p.empty else p.annotation
        default = p.default if p.default is not p.empty else ...
        if annotation in mapping:
            annotation, default = mapping[annotation]
        fields[name] = (annotation, default)
    return pydantic.create_model(f"{cls.__name__}Config", __config__=pydantic.ConfigDict(
        arbitrary_types_allowed=True, extra="forbid"), **fields)


def subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *subclasses(sub)]
    return out


def tagged_union(classes: list[type], mapping: dict) -> typing.Any:
    members = tuple(typing.Annotated[config_class(c, mapping), pydantic.Tag(c.__name__.lower())]
                    for c in classes)
    return typing.Annotated[typing.Union[members],
                            pydantic.Discriminator(lambda d: d.pop("kind", "").lower())]


optimizer_mapping = {ParamsT: (typing.List[dict], [])}
scheduler_mapping = {torch.optim.Optimizer: (typing.Optional[torch.optim.Optimizer], None)}
optimizer_configs = tagged_union(subclasses(cstorch.optim.Optimizer), optimizer_mapping)
scheduler_configs = tagged_union(subclasses(cstorch.optim.lr_scheduler.LRScheduler),
                                 scheduler_mapping)
optimizer_settings = pydantic.TypeAdapter(optimizer_configs).validate_python(
    {"kind": "SGD", "lr": LR, "momentum": MOMENTUM})
scheduler_settings = pydantic.TypeAdapter(scheduler_configs).validate_python(
    {"kind": "ConstantLR", "learning_rate": LR})


# ---- callbacks --------------------------------------------------------------------------
class Callback:
    def on_train_step_start(self, trainer, batch): ...
    def on_before_backward(self, trainer, outputs): ...
    def on_train_step_end(self, trainer, outputs): ...


class NormCallback(Callback):
    def on_before_backward(self, trainer, outputs):
        norm, norm0 = norms(trainer.model, trainer.model.device)
        trainer.log(norm=norm, norm0=norm0)


class LossCallback(Callback):
    def on_train_step_end(self, trainer, outputs):
        trainer.log(train=outputs["loss"])


class TensorBoardLogger:
    def __init__(self, model_dir: pathlib.Path):
        summary_dir = model_dir / "run"
        summary_dir.mkdir(parents=True)
        self.writer = SummaryWriter(log_dir=str(model_dir / "events"))
        event_file = self.writer._get_file_writer().event_writer._file_name
        (summary_dir / "tf_events").symlink_to(
            os.path.relpath(os.path.realpath(event_file), summary_dir))
        (summary_dir / "cs_events").symlink_to(
            os.path.relpath(os.path.realpath(self.writer.cs_events_dir), summary_dir))
        self.writer.add_text("config", json.dumps({"lr": LR}), 0)

    def log(self, name, value, step):
        self.writer.add_scalar(name, value, step)


# ---- the trainer ------------------------------------------------------------------------
class Trainer:
    def __init__(self, model_dir: pathlib.Path):
        self.model_dir = model_dir
        self.backend = cstorch.backend(BackendType.CPU)
        torch.manual_seed(0)
        with self.backend.device:
            self.model = Net()
        self.compiled_model = cstorch.compile(self.model, self.backend)
        optimizer_cls = getattr(cstorch.optim, type(optimizer_settings).__name__[:-6])
        self.optimizer = optimizer_cls(self.model.parameters(), **{
            k: v for k, v in optimizer_settings.model_dump().items() if k != "params"})
        scheduler_cls = getattr(cstorch.optim.lr_scheduler,
                                type(scheduler_settings).__name__[:-6])
        self.scheduler = scheduler_cls(self.optimizer, **{
            k: v for k, v in scheduler_settings.model_dump().items() if k != "optimizer"})
        self.callbacks = [NormCallback(), LossCallback()]
        self.logger = TensorBoardLogger(model_dir)
        self.global_step = 0
        self.logged = {}

    def call(self, hook, *a):
        for callback in self.callbacks:
            getattr(callback, hook)(self, *a)

    @cstorch.step_closure
    def log(self, **values):
        for name, value in values.items():
            self.logged.setdefault(name, []).append(value.item())
            self.logger.log(name, value.item(), self.global_step)

    @cstorch.checkpoint_closure
    def save_checkpoint(self):
        cstorch.save({"model": self.model.state_dict(),
                      "optimizer": self.optimizer.state_dict()},
                     self.model_dir / f"checkpoint_{self.global_step}.mdl")

    @cstorch.trace
    def training_step(self, batch):
        self.call("on_train_step_start", batch)
        outputs = self.compiled_model(batch)
        self.call("on_before_backward", outputs)
        outputs["loss"].backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.scheduler.step()
        self.call("on_train_step_end", outputs)
        return outputs

    @cstorch.trace
    @torch.no_grad()
    def validation_step(self, batch):
        return self.compiled_model(batch)

    def fit(self, train_loader, val_loader):
        listener = register_traced_tensor_hook(lambda tensor, name: None)
        transfer = register_after_tensor_to_cpu(lambda tensor, name: None)
        self.save_checkpoint()  # the initial checkpoint: no executor exists yet
        schedule = cstorch.utils.data.Schedule(
            [cstorch.utils.data.Schedule.Range(start=1, end=STEPS, step=2,
                                               include_last=True)])
        executor = cstorch.utils.data.DataExecutor(
            train_loader, num_steps=STEPS, checkpoint_steps=schedule, activation_steps=None)
        self.compiled_model.train()
        for batch in executor:
            self.training_step(batch)
            self.global_step += 1
            self.save_checkpoint()
        streamed = train_loader.state_dict()["samples_streamed"]
        scope = f"validate_{val_loader.id}"
        self.compiled_model.eval()
        losses = []

        @cstorch.step_closure
        def keep(loss):
            losses.append(loss.item())

        for batch in cstorch.utils.data.DataExecutor(val_loader, num_steps=VAL_STEPS):
            keep(self.validation_step(batch)["loss"])
        listener.remove()
        transfer.remove()
        self.logger.writer.close()
        return streamed, scope, sum(losses) / len(losses)


model_dir = args.out.parent / "model_dir"
trainer = Trainer(model_dir)
train_loader = cstorch.utils.data.DataLoader(lambda: train_batches)
val_loader = cstorch.utils.data.DataLoader(lambda: val_batches)
streamed, scope, val = trainer.fit(train_loader, val_loader)
result.update(trainer.logged)
result.update(val=val, streamed=streamed, scope=scope, loader_ids=[
    train_loader.id, val_loader.id],
    checkpoints=sorted(p.name for p in model_dir.glob("checkpoint_*.mdl")),
    links=[os.path.isfile(model_dir / "run" / "tf_events"),
           os.path.isdir(model_dir / "run" / "cs_events")],
    initial=cstorch.load(str(model_dir / "checkpoint_0.mdl"))["model"]["layers.0.bias"]
    .tolist())
torch.manual_seed(0)
result["built"] = Net().state_dict()["layers.0.bias"].tolist()
args.out.write_text(json.dumps(result))
