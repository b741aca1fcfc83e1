"""Constructs that once trained differently from torch eager, each a named test.

Every test runs the same small torch model through a cerebrax step and through torch
eager, with the same data and hyperparameters, and compares the losses and the final
weights (float32: rel 1e-5).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import cerebrax as cstorch

STEPS = 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches(n: int = STEPS):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)) for _ in range(n)]


def _weights(model: torch.nn.Module | dict) -> dict:
    state = model if isinstance(model, dict) else model.state_dict()
    return {k: np.asarray(v.detach() if isinstance(v, torch.Tensor) else v)
            for k, v in state.items()}


def _assert_same(eager, model, losses, want_losses):
    """Losses and final weights (modules or state dicts) equal to rel 1e-5."""
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-7)
    want = _weights(eager)
    for name, value in _weights(model).items():
        np.testing.assert_allclose(value, want[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_cstorch_clip_grad_norm_clips_after_loss_backward():
    """``cstorch.optim.clip_grad_norm_`` after ``loss.backward()`` clips as torch's does
    (it once left the gradients unclipped: the update equalled no clip at all)."""
    eager = _model()
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want = []
    for x, y in _batches():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(eager(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.01)
        opt.step()
        want.append(loss.item())

    cstorch.amp.set_half_dtype("float32")
    model = _model()
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        cstorch.optim.clip_grad_norm_(model.parameters(), 0.01)
        optimizer.step()
        return loss

    losses = [float(step(x, y)) for x, y in _batches()]
    _assert_same(eager, model, losses, want)


def _csx_run(half: str, loss_scale: float | None):
    cstorch.reset()
    cstorch.amp.set_half_dtype(half)
    model = _model()
    compiled = cstorch.compile(model, cstorch.backend("CSX"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = None if loss_scale is None else cstorch.amp.GradScaler(loss_scale=loss_scale)

    @cstorch.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
            return loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        return loss

    losses = [float(step(x, y)) for x, y in _batches()]
    return {k: np.asarray(v) for k, v in model.state_dict().items()}, losses


def test_a_static_loss_scale_is_removed_on_csx_at_float32():
    """``GradScaler(loss_scale=1024.0)`` with ``scale(loss).backward(); unscale_(opt);
    step(opt); update()`` and no clip trains as torch eager without a scaler (a power of
    two scales and unscales exactly); it once applied updates 1024 times too large on
    the CSX backend."""
    eager = _model()
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want = []
    for x, y in _batches():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(eager(x), y)
        loss.backward()
        opt.step()
        want.append(loss.item())
    model, losses = _csx_run("float32", 1024.0)
    _assert_same(eager, model, losses, want)


def test_a_static_loss_scale_is_removed_on_csx_at_float16():
    """The same at float16 compute, against the same float16 step without a scaler:
    scaling the loss by 2**10 and the gradients back by 2**-10 changes no float16 or
    float32 value that neither overflows nor underflows, so the two runs are equal."""
    plain, want = _csx_run("float16", None)
    scaled, losses = _csx_run("float16", 1024.0)
    _assert_same(plain, scaled, losses, want)


def test_a_returned_torch_value_is_a_torch_tensor_in_a_closure_called_outside():
    """Seed 001 calls ``post_training_step(loss)`` outside the step on the returned
    loss: the closure gets a torch tensor (it once got numpy, and ``torch.isnan(loss)``
    failed); the value is torch eager's."""
    eager = _model()
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want = []
    for x, y in _batches():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(eager(x), y)
        loss.backward()
        opt.step()
        want.append(loss.item())

    cstorch.amp.set_half_dtype("float32")
    model = _model()
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    seen = []

    @cstorch.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        optimizer.step()
        return loss

    @cstorch.step_closure
    def post_training_step(loss):
        assert isinstance(loss, torch.Tensor) and loss.dtype == torch.float32
        assert not torch.isnan(loss)
        seen.append(loss.item())

    for x, y in _batches():
        loss = step(x, y)
        assert isinstance(loss, torch.Tensor) and loss.dtype == torch.float32
        post_training_step(loss)
    np.testing.assert_allclose(seen, want, rtol=1e-5, atol=1e-7)
    _assert_same(eager, model, seen, want)


class _Int32Model(torch.nn.Module):
    """Asserts its ids are int32, as Model Zoo's models do."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, input_ids):
        assert input_ids.dtype == torch.int32, input_ids.dtype
        return self.head(self.emb(input_ids)).mean(dim=1)


@pytest.mark.parametrize("backend, half", [("CPU", "float32"), ("CSX", "float32"),
                                           ("CSX", "float16"), ("CSX", "bfloat16")])
def test_int32_inputs_stay_int32_in_forward(backend, half):
    """A torch int32 input is int32 inside ``forward``, at every precision (it once
    arrived as int64); at float32 the step trains as torch eager."""
    g = torch.Generator().manual_seed(2)
    data = [(torch.randint(0, 10, (4, 5), generator=g, dtype=torch.int32),
             torch.randn(4, 3, generator=g)) for _ in range(STEPS)]
    torch.manual_seed(0)
    eager = _Int32Model()
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want = []
    for ids, y in data:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(eager(ids), y)
        loss.backward()
        opt.step()
        want.append(loss.item())

    cstorch.amp.set_half_dtype(half)
    torch.manual_seed(0)
    model = _Int32Model()
    compiled = cstorch.compile(model, cstorch.backend(backend))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(ids, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(ids), y)
        loss.backward()
        optimizer.step()
        return loss

    losses = [float(step(ids, y)) for ids, y in data]
    if half == "float32":
        _assert_same(eager, model, losses, want)


def _view_write(out: torch.Tensor, how: str) -> torch.Tensor:
    if how == "setitem":
        out[:, 0] = 0
    elif how == "select":
        out.select(1, 1).mul_(0.5)
    elif how == "narrow":
        out.narrow(0, 0, 2).add_(1)
    elif how == "view of a view":
        out.t()[1:].narrow(1, 1, 2).sub_(0.25)
    return out


@pytest.mark.parametrize("how", ["setitem", "select", "narrow", "view of a view"])
def test_writes_through_views_reach_their_tensor(how):
    """In-place writes into views (``out[:, 0] = 0``, ``out.select(1, 1).mul_(0.5)``,
    ``out.narrow(0, 0, 2).add_(1)``) change the tensor they view, as in torch; they once
    changed only the view, and the loss differed from torch's without a word."""
    eager = _model()
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want = []
    for x, y in _batches():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(_view_write(eager(x).clone(), how), y)
        loss.backward()
        opt.step()
        want.append(loss.item())

    cstorch.amp.set_half_dtype("float32")
    model = _model()
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(_view_write(compiled(x).clone(), how), y)
        loss.backward()
        optimizer.step()
        return loss

    losses = [float(step(x, y)) for x, y in _batches()]
    _assert_same(eager, model, losses, want)


def test_a_write_into_a_view_of_a_gradient_changes_the_gradient():
    """``p.grad[0].mul_(2)`` after ``loss.backward()`` doubles row 0 of the gradient."""
    eager = _model()
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want = []
    for x, y in _batches():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(eager(x), y)
        loss.backward()
        eager[0].weight.grad[0].mul_(2)
        opt.step()
        want.append(loss.item())

    cstorch.amp.set_half_dtype("float32")
    model = _model()
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        model[0].weight.grad[0].mul_(2)
        optimizer.step()
        return loss

    losses = [float(step(x, y)) for x, y in _batches()]
    _assert_same(eager, model, losses, want)


def test_a_write_into_a_detached_alias_is_an_error_that_names_the_fix():
    """torch changes x's values but not its gradient when x.detach() is written in place:
    cerebrax refuses it at trace time instead of training differently."""
    cstorch.amp.set_half_dtype("float32")
    model = _model()
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        out = compiled(x)
        out.detach()[-1].zero_()
        loss = torch.nn.functional.mse_loss(out, y)
        loss.backward()
        optimizer.step()
        return loss

    x, y = _batches(1)[0]
    with pytest.raises(cstorch.errors.UnsupportedOpError, match=r"detach\(\)\.clone\(\)"):
        step(x, y)
