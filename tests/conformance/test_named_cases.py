"""Constructs that once trained differently from torch eager, each a named test.

Every test runs the same small torch model through a cerebrax step and through torch
eager, with the same data and hyperparameters, and compares the losses and the final
weights (float32: rel 1e-5). A step is described once, by what it does to the model's
output before the loss (``on_output``) and to the gradients after ``loss.backward()``
(``after_backward``): :func:`eager` and :func:`compiled` run the same description in
torch eager and through a ``cstorch.trace`` step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import pytest
import torch

import cerebrax as cstorch

STEPS = 4


class _Mlp(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


class _Int32Model(torch.nn.Module):
    """Asserts its ids are int32, as Model Zoo's models do."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, input_ids):
        assert input_ids.dtype == torch.int32, input_ids.dtype
        return self.head(self.emb(input_ids)).mean(dim=1)


class _MakesTensors(torch.nn.Module):
    """Makes tensors in ``forward`` on its inputs' and its weights' devices, as
    gigaGPT's attention (its scale and mask) and Model Zoo's norm layers do."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 3)
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)) / 8)

    def forward(self, x):
        h = self.norm(self.fc(x))
        scale = torch.tensor(1 / 8 ** 0.5, dtype=h.dtype, device=h.device)
        shift = torch.full((8,), 0.5, device=self.fc.weight.device)
        mask = self.mask + torch.zeros(8, 8, device=x.device)
        return self.head((h * scale + shift) @ mask)


class _ScoresItself(torch.nn.Module):
    """Updates a cstorch metric in ``forward`` in eval mode, as Model Zoo's models do."""

    def __init__(self):
        super().__init__()
        self.net = _Mlp()
        self.accuracy_metric = cstorch.metrics.AccuracyMetric("accuracy")

    def forward(self, x, labels):
        outputs = self.net(x)
        if not self.training:
            self.accuracy_metric(labels=labels.clone(), predictions=outputs.argmax(-1).int())
        return torch.nn.functional.cross_entropy(outputs, labels)


def _batches(n: int = STEPS) -> list:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)) for _ in range(n)]


def _id_batches(n: int = STEPS) -> list:
    g = torch.Generator().manual_seed(2)
    return [(torch.randint(0, 10, (4, 5), generator=g, dtype=torch.int32),
             torch.randn(4, 3, generator=g)) for _ in range(n)]


def _same(x, *_):
    return x


def _nothing(*_):
    return None


def eager(*, build: Callable = _Mlp, data: Callable = _batches, on_output: Callable = _same,
          after_backward: Callable = _nothing) -> tuple[torch.nn.Module, list[float]]:
    """Trains ``build()`` in torch eager with SGD: ``(model, losses)``."""
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in data():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(on_output(model(x), model), y)
        loss.backward()
        after_backward(model, opt)
        opt.step()
        losses.append(loss.item())
    return model, losses


def compiled(*, build: Callable = _Mlp, data: Callable = _batches, on_output: Callable = _same,
             after_backward: Callable = _nothing, backend: str = "CPU",
             half: str = "float32", loss_scale: float | None = None,
             closure: Callable | None = None, on_device: bool = False
             ) -> tuple[dict, list[float]]:
    """The same training through a cerebrax traced step: ``(weights, losses)``.

    ``loss_scale``: the step is the GradScaler sequence ``scale(loss).backward();
    unscale_(opt); step(opt); update()``. ``closure``: a step closure, called outside
    the step on each returned loss. ``on_device``: the model is built under
    ``with backend.device:``.
    """
    cstorch.reset()
    cstorch.amp.set_half_dtype(half)
    torch.manual_seed(0)
    backend = cstorch.backend(backend)
    with backend.device if on_device else contextlib.nullcontext():
        model = build()
    net = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = None if loss_scale is None else cstorch.amp.GradScaler(loss_scale=loss_scale)

    @cstorch.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(on_output(net(x), model), y)
        if scaler is None:
            loss.backward()
            after_backward(model, optimizer)
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            after_backward(model, optimizer)
            scaler.step(optimizer)
            scaler.update()
        return loss

    losses = []
    for x, y in data():
        loss = step(x, y)
        if closure is not None:
            closure(loss)
        losses.append(float(loss))
    return _weights(model), losses


def _weights(model: torch.nn.Module | dict) -> dict:
    state = model if isinstance(model, dict) else model.state_dict()
    return {k: np.asarray(v.detach() if isinstance(v, torch.Tensor) else v)
            for k, v in state.items()}


def _assert_same(want: tuple, got: tuple) -> None:
    """Losses and final weights of two runs equal to rel 1e-5."""
    (want_model, want_losses), (got_model, got_losses) = want, got
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5, atol=1e-7)
    expected = _weights(want_model)
    for name, value in _weights(got_model).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-7, err_msg=name)


# ---- gradients: one writer -------------------------------------------------------------------
def test_cstorch_clip_grad_norm_clips_after_loss_backward():
    """``cstorch.optim.clip_grad_norm_`` after ``loss.backward()`` clips as torch's does
    (it once left the gradients unclipped: the update equalled no clip at all)."""
    want = eager(after_backward=lambda m, _: torch.nn.utils.clip_grad_norm_(m.parameters(), 0.01))
    got = compiled(
        after_backward=lambda m, _: cstorch.optim.clip_grad_norm_(m.parameters(), 0.01))
    _assert_same(want, got)


def test_a_static_loss_scale_is_removed_on_csx_at_float32():
    """``GradScaler(loss_scale=1024.0)`` with ``scale(loss).backward(); unscale_(opt);
    step(opt); update()`` and no clip trains as torch eager without a scaler (a power of
    two scales and unscales exactly); it once applied updates 1024 times too large on
    the CSX backend."""
    _assert_same(eager(), compiled(backend="CSX", loss_scale=1024.0))


def test_a_static_loss_scale_is_removed_on_csx_at_float16():
    """The same at float16 compute, against the same float16 step without a scaler:
    scaling the loss by 2**10 and the gradients back by 2**-10 changes no float16 or
    float32 value that neither overflows nor underflows, so the two runs are equal."""
    plain = compiled(backend="CSX", half="float16")
    _assert_same(plain, compiled(backend="CSX", half="float16", loss_scale=1024.0))


def test_a_write_into_a_view_of_a_gradient_changes_the_gradient():
    """``p.grad[0].mul_(2)`` after ``loss.backward()`` doubles row 0 of the gradient."""
    double_row = lambda m, _: m[0].weight.grad[0].mul_(2)  # noqa: E731
    _assert_same(eager(after_backward=double_row), compiled(after_backward=double_row))


def _param_groups_params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


@pytest.mark.parametrize("clip", ["norm", "value"])
def test_torch_clipping_over_the_optimizers_param_groups(clip):
    """``torch.nn.utils.clip_grad_norm_`` over the parameters of
    ``optimizer.param_groups`` (as Cerebras' gigaGPT clips) clips as in torch eager; the
    parameters' ``.grad`` is a torch tensor there (it once was a JAX value, and torch's
    clip failed with "DynamicJaxprTracer has no attribute device")."""
    def clip_groups(model, optimizer):
        params = _param_groups_params(optimizer)
        assert all(isinstance(p.grad, torch.Tensor) for p in params)
        if clip == "norm":
            torch.nn.utils.clip_grad_norm_(params, 0.01)
        else:
            torch.nn.utils.clip_grad_value_(params, 0.02)

    _assert_same(eager(after_backward=clip_groups), compiled(after_backward=clip_groups))


# ---- the torch parameters themselves ---------------------------------------------------------
def test_a_penalty_on_the_torch_parameters_has_its_gradient():
    """``sum(p.pow(2).sum() for p in model.parameters())`` in the step's loss reads the
    parameters' current values and differentiates through them (torch code once read
    the values the module was built with, as constants: the penalty had no gradient)."""
    def penalized(out, model):
        return out + 0.05 * sum(p.pow(2).sum() for p in model.parameters())

    _assert_same(eager(on_output=penalized), compiled(on_output=penalized))


def test_torch_code_after_backward_reads_the_parameters_current_values():
    """A hand-written weight decay, ``p.grad.add_(p.detach(), alpha=0.1)`` after
    ``loss.backward()``, reads each step's weights (once: the initial ones)."""
    def decay(model, _):
        for p in model.parameters():
            p.grad.add_(p.detach(), alpha=0.1)

    _assert_same(eager(after_backward=decay), compiled(after_backward=decay))


def test_a_parameter_answers_torch_methods_only_while_a_step_is_traced():
    """Outside a traced step a compiled Parameter has no torch view: a torch method on it
    is an AttributeError that names the attribute (inside, ``p.detach()`` works; see the
    decay test over param_groups in test_table.py)."""
    cstorch.reset()
    model = _Mlp()
    cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    p = optimizer.param_groups[0]["params"][0]
    with pytest.raises(AttributeError, match="'Parameter' object has no attribute 'detach'"):
        p.detach()


# ---- what a step returns -------------------------------------------------------------------
def test_a_returned_torch_value_is_a_torch_tensor_in_a_closure_called_outside():
    """Seed 001 calls ``post_training_step(loss)`` outside the step on the returned
    loss: the closure gets a torch tensor (it once got numpy, and ``torch.isnan(loss)``
    failed); the value is torch eager's."""
    seen = []

    @cstorch.step_closure
    def post_training_step(loss):
        assert isinstance(loss, torch.Tensor) and loss.dtype == torch.float32
        assert not torch.isnan(loss)
        seen.append(loss.item())

    def returned(loss):
        assert isinstance(loss, torch.Tensor) and loss.dtype == torch.float32
        post_training_step(loss)

    want = eager()
    got = compiled(closure=returned)
    _assert_same(want, got)
    np.testing.assert_allclose(seen, want[1], rtol=1e-5, atol=1e-7)


# ---- inputs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend, half", [("CPU", "float32"), ("CSX", "float32"),
                                           ("CSX", "float16"), ("CSX", "bfloat16")])
def test_int32_inputs_stay_int32_in_forward(backend, half):
    """A torch int32 input is int32 inside ``forward``, at every precision (it once
    arrived as int64); at float32 the step trains as torch eager."""
    got = compiled(build=_Int32Model, data=_id_batches, backend=backend, half=half)
    if half == "float32":
        _assert_same(eager(build=_Int32Model, data=_id_batches), got)


@pytest.mark.parametrize("backend", ["CPU", "CSX"])
def test_a_model_built_under_backend_device_trains_as_one_built_on_the_cpu(backend):
    """A model built under ``with backend.device:`` whose ``forward`` makes tensors
    (``torch.tensor(...)``, ``torch.full``/``torch.zeros`` on its inputs' or weights'
    device) trains as torch eager (it once failed: "Cannot copy out of meta tensor",
    and device mismatches between meta and cpu)."""
    got = compiled(build=_MakesTensors, backend=backend, half="float32", on_device=True)
    _assert_same(eager(build=_MakesTensors), got)
    # And bit for bit as the same model built outside the context.
    built_on_cpu = compiled(build=_MakesTensors, backend=backend, half="float32")
    assert got[1] == built_on_cpu[1]
    for name, value in got[0].items():
        np.testing.assert_array_equal(value, built_on_cpu[0][name], err_msg=name)


@pytest.mark.parametrize("backend, half", [("CPU", "float32"), ("CSX", "float32"),
                                           ("CSX", "float16")])
def test_a_metric_updates_from_inside_forward(backend, half):
    """A cstorch metric called in a compiled model's ``forward``, in eval mode under
    ``torch.no_grad()``, accumulates every step's batch: its value is the accuracy that
    torch eager computes, and the summed loss is torch's (it once failed: ".numpy() is
    not supported for tensor subclasses")."""
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
               for _ in range(STEPS)]
    torch.manual_seed(0)
    reference = _Mlp().eval()
    with torch.no_grad():
        correct = sum(int((reference(x).argmax(-1) == y).sum()) for x, y in batches)
        want_loss = sum(float(torch.nn.functional.cross_entropy(reference(x), y))
                        for x, y in batches)

    cstorch.reset()
    cstorch.amp.set_half_dtype(half)
    torch.manual_seed(0)
    model = _ScoresItself()
    compiled_model = cstorch.compile(model, cstorch.backend(backend))
    compiled_model.eval()

    @cstorch.trace
    def evaluation_step(x, labels):
        return compiled_model(x, labels)

    with torch.no_grad():
        got_loss = sum(float(evaluation_step(x, y)) for x, y in batches)
    assert model.accuracy_metric.num_updates == STEPS
    accuracy = float(model.accuracy_metric)
    if half == "float32":
        assert accuracy == pytest.approx(correct / (8 * STEPS), abs=1e-7)
        assert got_loss == pytest.approx(want_loss, rel=1e-5)
    else:  # float16 logits: a prediction may flip where two logits nearly tie
        assert abs(accuracy - correct / (8 * STEPS)) <= 2 / (8 * STEPS)
        assert got_loss == pytest.approx(want_loss, rel=1e-2)


# ---- views -----------------------------------------------------------------------------------
def _view_write(how: str) -> Callable:
    def write(out: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
        out = out.clone()
        if how == "setitem":
            out[:, 0] = 0
        elif how == "select":
            out.select(1, 1).mul_(0.5)
        elif how == "narrow":
            out.narrow(0, 0, 2).add_(1)
        elif how == "view of a view":
            out.t()[1:].narrow(1, 1, 2).sub_(0.25)
        return out

    return write


@pytest.mark.parametrize("how", ["setitem", "select", "narrow", "view of a view"])
def test_writes_through_views_reach_their_tensor(how):
    """In-place writes into views (``out[:, 0] = 0``, ``out.select(1, 1).mul_(0.5)``,
    ``out.narrow(0, 0, 2).add_(1)``) change the tensor they view, as in torch; they once
    changed only the view, and the loss differed from torch's without a word."""
    _assert_same(eager(on_output=_view_write(how)), compiled(on_output=_view_write(how)))


def test_a_write_into_a_detached_alias_is_an_error_that_names_the_fix():
    """torch changes x's values but not its gradient when x.detach() is written in place:
    cerebrax refuses it at trace time instead of training differently."""
    def zero_last_row(out, model):
        out.detach()[-1].zero_()
        return out

    with pytest.raises(cstorch.errors.UnsupportedOpError, match=r"detach\(\)\.clone\(\)"):
        compiled(on_output=zero_last_row)


@pytest.mark.parametrize("write, match", [
    (lambda out: torch.view_as_real(torch.complex(out, out))[..., 1].zero_(),
     "reinterprets its tensor's bytes"),
    (lambda out: out[:1].expand(5, 3).add_(1), r"expand\(\)"),
])
def test_writes_torch_would_alias_differently_are_errors_that_name_the_fix(write, match):
    """A write through a view that reinterprets its tensor (``view_as_real``) and one
    into an expanded view (several elements are one; torch refuses it) raise at trace
    time instead of training differently."""
    def on_output(out, model):
        out = out.clone()
        write(out)
        return out

    with pytest.raises(cstorch.errors.UnsupportedOpError, match=match):
        compiled(on_output=on_output)
