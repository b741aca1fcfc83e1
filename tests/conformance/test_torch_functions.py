"""Custom autograd Functions and gradient hooks train as in torch eager, or are refused.

A ``torch.autograd.Function`` replaces the derivative of its forward by its own
``backward``; a gradient hook (``tensor.register_hook``, a module's full backward hook or
pre-hook) changes a gradient on its way back. Each test trains the same small model in
torch eager and through a cerebrax step (same weights, the same 4 batches, SGD) with one
such construct, in a module's ``forward`` (the exported graph) or in the step's own
torch code, and compares the losses and the final weights (float32: rel 1e-5), with the
helpers of ``test_named_cases``. Before torch_bridge honoured them, every one of these
trained differently without a word (the backward was ignored and the forward
differentiated; the hooks never ran) or, for a hook in the step, failed with torch's
"cannot register a hook on a tensor that doesn't require gradient". The last tests check
the refusals: a construct cerebrax cannot reproduce raises at trace time, naming the
Function or the hook and the fix.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from programs import ReverseGradient
from test_named_cases import compiled, eager

import cerebrax as cstorch


def _assert_same(want: tuple, got: tuple) -> None:
    """Losses and final weights of two runs equal to rel 1e-5."""
    (want_model, want_losses), (got_weights, got_losses) = want, got
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5, atol=1e-7)
    for name, value in want_model.state_dict().items():
        np.testing.assert_allclose(got_weights[name], value.detach().numpy(), rtol=1e-5,
                                   atol=1e-7, err_msg=name)


def _same_training(**kwargs) -> None:
    _assert_same(eager(**kwargs), compiled(**kwargs))


class _Net(torch.nn.Module):
    """Linear(6, 8) -> ``middle`` -> tanh -> Linear(8, 3)."""

    def __init__(self, middle: Callable):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.middle = middle

    def forward(self, x):
        return self.fc2(torch.tanh(self.middle(self.fc1(x))))


def _net(middle: Callable) -> Callable[[], torch.nn.Module]:
    return lambda: _Net(middle)


# ---- the Functions -------------------------------------------------------------------------
class RoundThrough(torch.autograd.Function):
    """Straight-through rounding to quarters: the gradient passes unchanged."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, grad):
        return grad


class LeakyThrough(torch.autograd.Function):
    """ReLU forward; backward lets ``slope`` of the gradient through where the input was
    negative. The input is kept as an attribute of ctx, not with save_for_backward."""

    @staticmethod
    def forward(ctx, x, slope):
        ctx.inputs = {"x": x}
        ctx.slope = slope
        return torch.relu(x)

    @staticmethod
    def backward(ctx, grad):
        x = ctx.inputs["x"]
        return torch.where(x > 0, grad, grad * ctx.slope), None


class RoundAndScale(torch.autograd.Function):
    """Two tensor outputs, an integer one (non-differentiable, as torch makes it) and a
    Python value: ``(round(x), 3 * x, x > 0, "tag")``; backward takes the rounded output
    straight through and the scaled one at twice its derivative."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x), 3 * x, x > 0, "tag"

    @staticmethod
    def backward(ctx, grad_round, grad_scaled, grad_sign, grad_tag):
        assert grad_tag is None and grad_sign.dtype == torch.bool
        return grad_round + 6 * grad_scaled


class ScaledSign(torch.autograd.Function):
    """``setup_context`` style with a keyword default: ``sign(x) * scale``; backward
    ``grad * scale * (1 - tanh(x)**2)`` (a smooth surrogate), once differentiable."""

    @staticmethod
    def forward(x, scale=0.5):
        return torch.sign(x) * scale

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, scale = inputs
        ctx.save_for_backward(x)
        ctx.scale = scale

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        return grad * ctx.scale * (1 - torch.tanh(x) ** 2), None


def _apply_takes_keywords() -> bool:
    """torch 2.11's ``Function.apply`` binds a ``setup_context`` Function's defaults but
    still hands the keywords on to its C++ ``apply``, which takes none: eager torch
    itself raises TypeError for ``ScaledSign.apply(h, scale=2.0)`` there."""
    try:
        ScaledSign.apply(torch.ones(1), scale=2.0)
    except TypeError:
        return False
    return True


_KEYWORDS = pytest.mark.skipif(not _apply_takes_keywords(),
                               reason="this torch's Function.apply takes no keywords")


class NonDifferentiableHalf(torch.autograd.Function):
    """``(2x, x.round())`` with the second marked non-differentiable and gradients not
    materialized: backward gets None for it."""

    @staticmethod
    def forward(ctx, x):
        rounded = x.round()
        ctx.mark_non_differentiable(rounded)
        ctx.set_materialize_grads(False)
        return 2 * x, rounded

    @staticmethod
    def backward(ctx, grad, grad_rounded):
        assert grad_rounded is None
        return 3 * grad


# ---- Functions in forward --------------------------------------------------------------------
def test_straight_through_rounding_in_forward():
    """The layers before a straight-through rounding get the gradient passed through it
    (they once got zero: JAX differentiated ``round``)."""
    _same_training(build=_net(RoundThrough.apply))


def test_gradient_reversal_with_a_python_argument():
    """``backward`` returns ``-alpha * grad`` with ``alpha`` a non-tensor argument."""
    _same_training(build=_net(lambda h: ReverseGradient.apply(h, 0.5)))


def test_a_tensor_kept_as_a_ctx_attribute_and_a_python_argument():
    """A tensor saved as an attribute of ctx (inside a dict) reaches backward."""
    _same_training(build=_net(lambda h: LeakyThrough.apply(h, 0.25)))


def test_several_outputs_an_integer_one_and_a_python_value():
    """Backward gets one gradient per output: the cotangents, zeros for the integer
    output, None for the Python value."""
    def middle(h):
        rounded, scaled, positive, tag = RoundAndScale.apply(h)
        assert tag == "tag"
        return rounded + torch.where(positive, scaled, 0.0)

    _same_training(build=_net(middle))


@_KEYWORDS
def test_setup_context_keyword_default_and_once_differentiable():
    _same_training(build=_net(lambda h: ScaledSign.apply(h) + ScaledSign.apply(h, scale=2.0)))


@_KEYWORDS
def test_a_setup_context_apply_bound_before_the_step():
    """``apply`` taken from the class before the step (from torch 2.14, torch's C++ apply
    bound to the class, which calls ``forward`` with grad mode off)."""
    scaled_sign = ScaledSign.apply
    _same_training(build=_net(lambda h: scaled_sign(h) + scaled_sign(h, scale=2.0)))


@pytest.mark.parametrize("function", ["ReverseGradient", "ScaledSign"])
def test_an_apply_bound_before_the_step_on_a_parameter(function):
    apply = {"ReverseGradient": ReverseGradient, "ScaledSign": ScaledSign}[function].apply
    _same_training(on_output=lambda out, model: out * apply(model[2].bias, 2.0))


def test_a_non_differentiable_output_without_materialized_gradients():
    def middle(h):
        doubled, rounded = NonDifferentiableHalf.apply(h)
        return doubled + rounded  # the rounded output's use gives h no gradient

    _same_training(build=_net(middle))


# ---- Functions in the step -------------------------------------------------------------------
def test_a_function_applied_in_the_step_on_the_models_output():
    """``RoundThrough.apply(net(x))`` in the step's own torch code."""
    _same_training(on_output=lambda out, model: RoundThrough.apply(out))


def test_a_function_applied_in_the_step_on_a_parameter():
    """A compiled model's parameter given to ``Function.apply`` in the step is its
    current value, differentiated through the Function's backward."""
    _same_training(on_output=lambda out, model: out * ReverseGradient.apply(model[2].bias, 0.5))


# ---- tensor hooks ----------------------------------------------------------------------------
class _Hooked(torch.nn.Module):
    """Registers a hook on an activation after one of its uses: the hook sees the
    gradient of both uses, as torch's does; a second hook, removed, is not called."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = self.fc1(x)
        early = torch.tanh(h)
        h.register_hook(lambda g: g * 3)
        h.register_hook(lambda g: g.clamp(-0.01, 0.01))
        h.register_hook(lambda g: g * 100).remove()
        return self.fc2(early) + 0.1 * h[:, :3]


def test_an_activation_hook_in_forward_sees_every_use():
    _same_training(build=_Hooked)


def test_a_hook_on_a_tensor_in_the_step():
    def on_output(out, model):
        out.register_hook(lambda g: g * 0.5)
        return out

    _same_training(on_output=on_output)


# ---- module hooks ----------------------------------------------------------------------------
def _with_module_hooks() -> torch.nn.Module:
    net = _Net(torch.nn.Tanh())
    net.middle.register_full_backward_pre_hook(lambda m, grad_out: (grad_out[0] * 2,))
    net.fc2.register_full_backward_hook(
        lambda m, grad_in, grad_out: (grad_in[0].clamp(-0.02, 0.02),))
    return net


def test_module_full_backward_hook_and_pre_hook():
    """A submodule's full backward pre-hook (on its output gradient) and full backward
    hook (on its input gradient) run as in torch."""
    _same_training(build=_with_module_hooks)


# ---- refusals --------------------------------------------------------------------------------
class ReadsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * (2 if grad.abs().max().item() < 1 else 1)


class ReadsInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * x.abs().max().item()

    @staticmethod
    def backward(ctx, grad):
        return grad


class WritesItsInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x.mul_(2)

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


class TooFewGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        return x * scale

    @staticmethod
    def backward(ctx, grad):
        return grad


@pytest.mark.parametrize("function, error, match", [
    (ReadsInBackward, cstorch.errors.TensorReadError,
     r"backward of the custom autograd.Function \S*ReadsInBackward reads a tensor's\s+value"),
    (ReadsInForward, cstorch.errors.TensorReadError,
     r"forward of the custom autograd.Function \S*ReadsInForward reads a tensor's\s+value"),
    (WritesItsInput, cstorch.errors.UnsupportedOpError,
     r"WritesItsInput writes into its input in place"),
    (TooFewGradients, cstorch.errors.UnsupportedOpError,
     r"TooFewGradients returned 1 gradient\(s\), but its\s+forward has 2 input"),
])
@pytest.mark.parametrize("where", ["forward", "step"])
def test_a_function_cerebrax_cannot_run_is_refused(function, error, match, where):
    """A forward or backward that reads a value (``.item()``), a forward that writes its
    input in place (``ctx.mark_dirty``) and a backward that returns too few gradients
    raise at trace time, naming the Function (the backward once never ran, and the
    forward's read was JAX's error)."""
    if function is TooFewGradients:
        apply = lambda h: function.apply(h, 2.0)  # noqa: E731
    else:
        apply = lambda h: function.apply(h.clone())  # noqa: E731
    if where == "forward":
        run = lambda: compiled(build=_net(apply))  # noqa: E731
    else:
        run = lambda: compiled(on_output=lambda out, model: apply(out))  # noqa: E731
    with pytest.raises(error, match=match):
        run()


def test_a_hook_after_a_use_in_the_step_is_refused():
    def on_output(out, model):
        doubled = out * 2
        out.register_hook(lambda g: g * 0.5)
        return doubled

    with pytest.raises(cstorch.errors.UnsupportedOpError, match="before its first use"):
        compiled(on_output=on_output)


def test_a_deprecated_module_backward_hook_is_refused():
    def build():
        net = _Net(torch.nn.Tanh())
        net.fc2.register_backward_hook(lambda m, grad_in, grad_out: None)
        return net

    with pytest.raises(cstorch.errors.UnsupportedOpError, match="register_full_backward_hook"):
        compiled(build=build)
