"""Two custom autograd Functions of the kind Model Zoo's models use train as in torch.

Model Zoo's rotary position embedding and its clamped SwiGLU are ``torch.autograd.
Function``s (written here anew, after their description):

- ``RotaryPosEmb(x, sin, cos)``: ``x * cos + rotate_every_two(x) * sin``, backward
  ``grad * cos - rotate_every_two(grad * sin)``; at precision optimization level
  ``cstorch.current_pol() >= 1`` both compute in the half dtype and cast back;
- ``ClampOpt(x, min_val, max_val)``: clamps with ``torch.maximum`` / ``torch.minimum``;
  its backward passes the gradient where ``min_val <= x <= max_val``, bounds included,
  where the derivative of the forward gives half of it at a bound (JAX's ``maximum``
  splits a tie).

A small model uses both (linear -> rotary embedding with sin/cos buffers -> linear ->
clamped SwiGLU -> linear); three units of the middle linear start with zero weights
and biases at the clamp bounds, so that the first step's activations sit exactly on
them. It trains 4 SGD steps through cerebrax and in torch eager, at levels 0 and 1:
on the CPU backend equal to torch eager's float32 run (rel 1e-5); on the CSX backend at
float16 within the float16 bound of ``test_table.py`` (the distance to the exact,
float64, computation at most ``K`` times torch eager's own float16 error plus one
rounding). Before torch_bridge honoured Functions, the Functions' forwards were
differentiated instead, and the gradient at the bounds was halved.
"""

from __future__ import annotations

import copy

import programs as P
import pytest
import torch

import cerebrax as cstorch

STEPS = 4
LIMIT = 0.5  # the clamp bound, a float16 number
LR = 0.1
# Units of the middle linear (glu half 0-7, linear half 8-15) that start exactly at a
# clamp bound: zero weights, the bound as bias.
AT_BOUNDS = ((0, LIMIT), (1, LIMIT), (9, -LIMIT), (10, LIMIT))
OUT_SCALE = 4.0  # their outputs weigh more: the gradient at the bounds matters


def _half_dtype() -> torch.dtype:
    """The half dtype cstorch computes in (Model Zoo reads ``cstorch.amp``'s)."""
    return getattr(torch, cstorch.amp.get_half_dtype_str())


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """``(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)``."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


class RotaryPosEmb(torch.autograd.Function):
    """Rotary position embedding with a hand-written backward (see the module docstring)."""

    levels: list[int] = []  # the level each forward ran at (for a test)

    @staticmethod
    def forward(ctx, x, sin, cos):
        ctx.save_for_backward(x, sin, cos)
        dtype = x.dtype
        RotaryPosEmb.levels.append(cstorch.current_pol())
        if cstorch.current_pol() >= 1:
            half = _half_dtype()
            x, sin, cos = x.to(half), sin.to(half), cos.to(half)
        return (x * cos + rotate_every_two(x) * sin).to(dtype)

    @staticmethod
    def backward(ctx, grad):
        x, sin, cos = ctx.saved_tensors
        if cstorch.current_pol() >= 1:
            half = _half_dtype()
            grad, sin, cos = grad.to(half), sin.to(half), cos.to(half)
        grad_x = grad * cos - rotate_every_two(grad * sin)
        return grad_x.to(x.dtype), None, None


def clamp(x, min_val=None, max_val=None):
    """ClampOpt's forward (differentiated as it is, a tie at a bound gets half)."""
    if min_val is not None:
        x = torch.maximum(x, torch.tensor(min_val, dtype=x.dtype, device=x.device))
    if max_val is not None:
        x = torch.minimum(x, torch.tensor(max_val, dtype=x.dtype, device=x.device))
    return x


class ClampOpt(torch.autograd.Function):
    """A clamp whose gradient passes at the bounds too (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, min_val=None, max_val=None):
        ctx.save_for_backward(x)
        ctx.min_val, ctx.max_val = min_val, max_val
        return clamp(x, min_val, max_val)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        inside = torch.ones_like(x, dtype=torch.bool)
        if ctx.min_val is not None:
            inside = inside & (x >= ctx.min_val)
        if ctx.max_val is not None:
            inside = inside & (x <= ctx.max_val)
        return torch.where(inside, grad, torch.zeros_like(grad)), None, None


class RotaryClampedMlp(torch.nn.Module):
    """linear -> rotary embedding -> linear -> clamped SwiGLU -> linear."""

    def __init__(self, seq: int = 4, width: int = 8, *, differentiated: bool = False):
        super().__init__()
        self.clamp = clamp if differentiated else ClampOpt.apply
        self.fc_in = torch.nn.Linear(6, width)
        self.fc_mid = torch.nn.Linear(width, 2 * width)
        self.fc_out = torch.nn.Linear(width, 3)
        angles = torch.arange(seq)[:, None] / 10 ** (torch.arange(width // 2) / (width // 2))
        self.register_buffer("sin", angles.sin().repeat_interleave(2, -1))
        self.register_buffer("cos", angles.cos().repeat_interleave(2, -1))
        with torch.no_grad():
            for unit, bias in AT_BOUNDS:
                self.fc_mid.weight[unit] = 0.0
                self.fc_mid.bias[unit] = bias
                self.fc_out.weight[:, unit % width] *= OUT_SCALE

    def rotary(self, h):
        return RotaryPosEmb.apply(h, self.sin, self.cos)

    def forward(self, x):
        h = self.rotary(self.fc_in(x))
        glu, linear = self.fc_mid(h).chunk(2, dim=-1)
        glu = self.clamp(glu, None, LIMIT)
        linear = self.clamp(linear, -LIMIT, LIMIT)
        return self.fc_out(torch.nn.functional.silu(glu) * linear)


class RotaryAtLevel0(RotaryClampedMlp):
    """The rotary embedding inside a ``pol(level=0)`` region of ``forward``."""

    @cstorch.pol(level=0)
    def rotary(self, h):
        return super().rotary(h)


def _batches() -> list:
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(4, 4, 6, generator=g), torch.randn(4, 4, 3, generator=g))
            for _ in range(STEPS)]


def _set_level(pol: int) -> None:
    cstorch.reset()
    cstorch.backends.csx.precision.optimization_level = pol


def run_eager(pol: int, precision: str = "float32", *, differentiated: bool = False,
              build: type = RotaryClampedMlp) -> P.Run:
    """torch eager at ``precision``: ``float32``, ``float64``, or ``float16`` (a float16
    copy of the model computes, float32 master weights learn). ``differentiated``: the
    clamps' forward is differentiated in place of ClampOpt's backward."""
    _set_level(pol)
    torch.manual_seed(0)
    model = build(differentiated=differentiated)
    dtype = torch.float64 if precision == "float64" else torch.float32
    model = model.to(dtype)
    half = copy.deepcopy(model).half() if precision == "float16" else None
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in _batches():
        optimizer.zero_grad()
        if half is None:
            out = model(x.to(dtype))
        else:
            with torch.no_grad():
                for h, m in zip(half.parameters(), model.parameters()):
                    h.copy_(m)
                    h.grad = None
            out = half(x.half()).float()
        loss = torch.nn.functional.mse_loss(out, y.to(dtype))
        loss.backward()
        if half is not None:
            for h, m in zip(half.parameters(), model.parameters()):
                m.grad = h.grad.float()
        optimizer.step()
        losses.append(loss.item())
    return P.Run(losses, {}, {}, P.weights_of(model))


def run_cerebrax(pol: int, backend: str = "CPU", half: str | None = None, *,
                 build: type = RotaryClampedMlp) -> P.Run:
    """The same training through a ``cstorch.trace`` step on ``backend`` (with
    ``set_half_dtype(half)`` where given)."""
    _set_level(pol)
    if half is not None:
        cstorch.amp.set_half_dtype(half)
    torch.manual_seed(0)
    model = build()
    net = cstorch.compile(model, cstorch.backend(backend))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=LR)

    @cstorch.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        return loss

    losses = [float(step(x, y)) for x, y in _batches()]
    weights = P.weights_of(model)
    cstorch.reset()
    return P.Run(losses, {}, {}, weights)


def test_the_first_step_sits_on_the_clamp_bounds():
    """The data and weights do what the other tests rely on: activations exactly at
    both bounds in the first step."""
    torch.manual_seed(0)
    model = RotaryClampedMlp()
    x, _ = _batches()[0]
    glu, linear = model.fc_mid(RotaryPosEmb.apply(model.fc_in(x), model.sin,
                                                  model.cos)).chunk(2, dim=-1)
    assert int((glu == LIMIT).sum()) > 0 and int((linear == -LIMIT).sum()) > 0


@pytest.mark.parametrize("pol", [0, 1])
def test_trains_as_torch_eager_on_the_cpu_backend(pol):
    P.assert_same(run_eager(pol), run_cerebrax(pol))


def test_a_pol_region_inside_forward_applies_to_the_function():
    """At level 1, the rotary embedding inside a ``pol(level=0)`` region of ``forward``
    computes in float32 in torch eager; cerebrax runs the Function's forward again where
    the graph runs, outside the region, and restores the region's level there."""
    want = run_eager(1, build=RotaryAtLevel0)
    RotaryPosEmb.levels.clear()
    got = run_cerebrax(1, build=RotaryAtLevel0)
    assert RotaryPosEmb.levels and set(RotaryPosEmb.levels) == {0}, RotaryPosEmb.levels
    P.assert_same(want, got)


@pytest.mark.parametrize("pol", [0, 1])
def test_trains_within_the_float16_bound_on_csx(pol):
    """CSX at float16 against the exact computation (float64, the same math without
    half-precision casts), within ``K`` times torch eager's own float16 error."""
    got = run_cerebrax(pol, "CSX", "float16")
    P.assert_within_float16_bound(run_eager(0, "float64"), run_eager(pol, "float16"), got)


@pytest.mark.parametrize("pol", [0, 1])
def test_the_comparisons_catch_the_forward_differentiated(pol):
    """Both comparisons fail for ClampOpt's forward differentiated in place of its
    backward (what cerebrax once computed: half of the gradient at the bounds)."""
    wrong32 = run_eager(pol, differentiated=True)
    with pytest.raises(AssertionError):
        P.assert_same(run_eager(pol), wrong32)
    wrong16 = run_eager(pol, "float16", differentiated=True)
    assert P.float16_excess(run_eager(0, "float64"), run_eager(pol, "float16"), wrong16)
