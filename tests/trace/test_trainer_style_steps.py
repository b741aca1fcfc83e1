"""Steps written as Cerebras Model Zoo's Trainer writes them, against torch eager.

- ``@cstorch.trace`` on a method (``Trainer.training_step(self, batch)``): each instance
  binds its own traced step;
- ``model.device`` of the torch module and of the compiled model (the norm callbacks'
  ``torch.tensor(0.0).to(model.device)``);
- an accumulator made in the step and written in place with the step's values
  (``param_norm += torch.norm(p) ** 2``), also read through an alias, returned, and passed
  to a step closure.
"""

from __future__ import annotations

import copy

import pytest
import torch

import cerebrax as cstorch
from cerebrax.errors import ConfigError, UnsupportedOpError

STEPS = 3


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)


def _module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _norms(module: torch.nn.Module, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The model-wise squared norm of the parameters, and the first layer's, as Model
    Zoo's norm callback accumulates them."""
    total = torch.tensor(0.0).to(device)
    per_layer = {}
    for name, p in module.named_parameters():
        total += torch.pow(torch.norm(p), 2.0)
        layer = name.split(".")[0]
        if layer not in per_layer:
            per_layer[layer] = torch.tensor(0.0).to(device)
        per_layer[layer] += torch.pow(torch.norm(p), 2.0)
    return total, per_layer["0"]


def _eager() -> list[tuple[float, float, float]]:
    module = _module()
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    x, y = _batch()
    out = []
    for _ in range(STEPS):
        loss = torch.nn.functional.mse_loss(module(x), y)
        total, first = _norms(module, "cpu")
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append((loss.item(), total.item(), first.item()))
    return out


class _Trainer:
    """A trainer as Model Zoo writes one: the step is a traced method."""

    def __init__(self):
        self.module = _module()
        self.model = cstorch.compile(self.module, "CPU")
        self.optimizer = cstorch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.logged: list = []

    @cstorch.step_closure
    def log(self, loss, total, first):
        self.logged.append((float(loss), float(total), float(first)))

    @cstorch.trace
    def training_step(self, batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        total, first = _norms(self.module, self.module.device)
        self.log(loss, total, first)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {"loss": loss, "norm": total}


def test_a_traced_method_trains_as_torch_eager_and_binds_each_instance():
    trainer = _Trainer()
    batch = _batch()
    outputs = [trainer.training_step(batch) for _ in range(STEPS)]
    want = _eager()
    got = trainer.logged
    assert len(got) == STEPS
    for (gl, gt, gf), (wl, wt, wf) in zip(got, want):
        assert gl == pytest.approx(wl, rel=1e-5)
        assert gt == pytest.approx(wt, rel=1e-5)
        assert gf == pytest.approx(wf, rel=1e-5)
    # the returned accumulator is the step's value, not the 0 it was made with
    assert float(outputs[-1]["norm"]) == pytest.approx(want[-1][1], rel=1e-5)
    # the bound step is kept on the instance; the class attribute stays the traced step
    assert trainer.training_step is trainer.training_step
    assert isinstance(_Trainer.training_step, cstorch.trace(lambda: None).__class__)
    assert trainer.training_step.num_compiles == 1


def test_two_instances_each_compile_their_own_traced_method():
    cstorch.reset()
    first = _Trainer()
    first.training_step(_batch())
    cstorch.reset()
    second = _Trainer()
    second.training_step(_batch())
    assert first.training_step is not second.training_step
    assert first.logged[0] == pytest.approx(second.logged[0], rel=1e-6)


def test_a_traced_method_on_a_class_without_dict_is_refused_with_the_fix():
    class Slotted:
        __slots__ = ()

        @cstorch.trace
        def step(self, x):
            return x

    with pytest.raises(ConfigError, match="no __dict__"):
        Slotted().step  # noqa: B018


def test_module_device_and_compiled_model_device_are_the_backends_torch_device():
    module = _module()
    model = cstorch.compile(module, "CPU")
    assert module.device == model.device == model.backend.torch_device == torch.device("cpu")


def test_compile_keeps_a_device_attribute_of_the_modules_own():
    class OwnDevice(torch.nn.Linear):
        device = "mine"

    module = OwnDevice(2, 2)
    cstorch.compile(module, "CPU")
    assert module.device == "mine"


def test_an_accumulator_read_through_an_alias_sees_the_writes():
    """``alias = n; n += ...``: torch's ``+=`` writes into the one tensor both names hold."""
    module = _module()
    model = cstorch.compile(module, "CPU")
    reference = copy.deepcopy(_module())
    x, _ = _batch()

    @cstorch.trace
    def step(x):
        n = torch.zeros(())
        alias = n
        for p in module.parameters():
            n += p.square().sum()
        n.mul_(2.0)
        return model(x).sum(), alias

    _, got = step(x)
    want = 2.0 * sum(p.square().sum() for p in reference.parameters())
    assert float(got) == pytest.approx(want.item(), rel=1e-5)


def test_an_in_place_write_into_a_tensor_made_before_the_step_is_still_refused():
    """A tensor made outside the step would not keep the step's writes: refused."""
    module = _module()
    model = cstorch.compile(module, "CPU")
    outside = torch.zeros(())
    x, _ = _batch()

    @cstorch.trace
    def step(x):
        for p in module.parameters():
            outside.add_(p.sum())
        return model(x).sum()

    with pytest.raises(UnsupportedOpError, match="not part of the compiled step"):
        step(x)


class _SharedNorm(torch.nn.Module):
    """Model Zoo's gpt2 holds its final norm twice: as ``ln_f`` and inside the decoder."""

    def __init__(self):
        super().__init__()
        self.ln_f = torch.nn.LayerNorm(8)
        self.decoder = torch.nn.Sequential(torch.nn.Linear(4, 8), self.ln_f)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.decoder(x))


def test_a_submodule_registered_twice_keeps_its_parameters_and_trains_as_eager():
    """Built under ``with backend.device`` (its storage handed over), the module's export
    swapped the twice-registered norm's tensors for fake ones and left them there: torch
    code in the step (Model Zoo's norm callback) then met fake tensors."""
    backend = cstorch.backend("CPU")
    torch.manual_seed(0)
    with backend.device:
        module = _SharedNorm()
    torch.manual_seed(0)
    reference = _SharedNorm()
    model = cstorch.compile(module, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch()
    norms = []

    @cstorch.step_closure
    def keep(norm):
        norms.append(float(norm))

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        total = torch.tensor(0.0).to(module.device)
        for p in module.parameters():
            total += p.square().sum()
        keep(total)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    want = []
    for _ in range(STEPS):
        step(x, y)
        want.append(sum(p.square().sum() for p in reference.parameters()).item())
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert {type(p) for p in module.parameters()} == {torch.nn.Parameter}
    assert norms == pytest.approx(want, rel=1e-5)
