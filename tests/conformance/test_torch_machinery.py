"""torch's own autograd machinery inside a traced step, each construct a named test.

Every construct here once trained differently from torch eager without a word, or failed
with torch's raw error. Each test runs one step description (:mod:`machinery`) in torch
eager and through cerebrax and compares losses and final weights at float32 (rel 1e-5),
or checks that cerebrax refuses the construct at trace time with a
:class:`cerebrax.errors.CerebraxError` that names the fix.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import cerebrax as cstorch
import machinery as M
from machinery import check, plain_step

F = torch.nn.functional


# ---- .data and detach() -----------------------------------------------------------------
def _clip_weights_through_data(net, module, optimizer, x, y):
    """WGAN's weight clipping: ``p.data.clamp_`` under ``no_grad`` after the update."""
    loss = plain_step(net, module, optimizer, x, y)
    with torch.no_grad():
        for p in module.parameters():
            p.data.clamp_(-0.2, 0.2)
    return loss


def test_a_write_through_p_data_after_the_update_changes_the_parameter():
    """``p.data.clamp_(-0.2, 0.2)`` after ``optimizer.step()`` clips the weights (it was
    lost: max|w| stayed 0.407 where torch has 0.2)."""
    check(_clip_weights_through_data)
    _, weights = M.run(_clip_weights_through_data, eager=False)
    assert max(abs(w).max() for w in weights.values()) == np.float32(0.2)


def test_zeroing_a_parameter_through_data_and_through_detach():
    """``p.data.zero_()`` and ``p.detach().mul_(0.5)`` write the parameter, as torch's
    shared storage does."""
    def body(net, module, optimizer, x, y):
        loss = plain_step(net, module, optimizer, x, y)
        module.fc2.bias.data.zero_()
        module.fc1.weight.detach().mul_(0.5)
        return loss

    check(body)


def test_assigning_p_data_replaces_the_parameters_value():
    """``p.data = tensor`` after the update sets the parameter's value."""
    def body(net, module, optimizer, x, y):
        loss = plain_step(net, module, optimizer, x, y)
        module.fc1.weight.data = module.fc1.weight.data * 0.9 + 0.01
        return loss

    check(body)


def test_a_write_through_data_before_the_forward_keeps_the_gradient():
    """``p.data.mul_(0.9)`` before the forward pass changes the value the forward reads;
    the parameter is still a leaf: its gradient is the loss's at the new value."""
    def body(net, module, optimizer, x, y):
        optimizer.zero_grad()
        module.fc1.weight.data.mul_(0.9)
        loss = F.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        return loss

    check(body)


def test_reads_of_data_and_detach_carry_no_gradient():
    """``p.data`` and ``x.detach()`` in the loss are constants of the backward pass, as in
    torch: a product ``out * out.detach()`` has the gradient of ``out`` times its value,
    not twice that (the detach was ignored, and the weights ended 0.8 away)."""
    def body(net, module, optimizer, x, y):
        optimizer.zero_grad()
        out = net(x)
        w = module.fc1.weight
        loss = (F.mse_loss(out, y) + 0.1 * (out * out.detach()).mean()
                + 0.1 * (w * w.detach()).sum() + 0.1 * (w.data * w).sum())
        loss.backward()
        optimizer.step()
        return loss

    check(body)


def test_a_write_into_a_detached_activation_is_still_refused():
    """An activation's ``detach()`` written in place changes the activation's values but
    not its gradient in torch; cerebrax refuses it (only a parameter's ``.data`` and
    ``detach()`` are writable: they are the parameter's storage)."""
    def body(net, module, optimizer, x, y):
        out = net(x)
        out.detach()[0].zero_()
        return F.mse_loss(out, y)

    with pytest.raises(cstorch.errors.UnsupportedOpError, match=r"detach\(\)\.clone\(\)"):
        M.run(body, eager=False)


# ---- parameter hooks --------------------------------------------------------------------
def _with_hooks(*hooks):
    """Builds the MLP with ``hooks`` registered on ``fc1.weight`` and ``fc2.bias``."""
    def build():
        module = M.Mlp()
        for hook in hooks:
            module.fc1.weight.register_hook(hook)
            module.fc2.bias.register_hook(hook)
        return module

    return build


def test_a_parameter_hook_changes_the_parameters_gradient():
    """``p.register_hook(lambda g: g.clamp(-0.01, 0.01))`` before training clamps the
    gradient of ``p`` at every step (the hook was ignored: weights 7.8% away)."""
    check(build=_with_hooks(lambda g: g.clamp(-0.01, 0.01)))


def test_parameter_hooks_chain_in_registration_order():
    """Each hook gets the previous one's result; one that returns None keeps it."""
    check(build=_with_hooks(lambda g: g * 3, lambda g: None, lambda g: g.clamp(-0.05, 0.05)))


def test_a_parameter_hook_sees_the_gradient_clipping_then_clips():
    """A hook runs before ``clip_grad_norm_`` (on the gradient of the backward pass)."""
    def body(net, module, optimizer, x, y):
        optimizer.zero_grad()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 0.05)
        optimizer.step()
        return loss

    check(body, build=_with_hooks(lambda g: g.sign() * g.abs().sqrt()))


def test_registering_a_parameter_hook_inside_the_step_is_refused():
    """torch registers a hook again at every step; a traced step would register it once."""
    def body(net, module, optimizer, x, y):
        module.fc1.weight.register_hook(lambda g: g * 2)
        return plain_step(net, module, optimizer, x, y)

    with pytest.raises(cstorch.errors.UnsupportedOpError, match="before the step is first"):
        M.run(body, eager=False)


def test_a_hook_removed_after_the_step_compiled_is_a_recompile_error():
    """The compiled step applies the hooks it saw; removing one later raises instead of
    training on with it."""
    cstorch.reset()
    module = M.Mlp()
    handle = module.fc1.weight.register_hook(lambda g: g * 2)
    net = cstorch.compile(module, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(module.parameters(), lr=0.1)
    step = cstorch.trace(lambda x, y: plain_step(net, module, optimizer, x, y))
    (x, y), = M.batches(1)
    step(x, y)
    handle.remove()
    with pytest.raises(cstorch.errors.RecompileError, match="hooks were registered or removed"):
        step(x, y)
    cstorch.reset()


def test_a_post_accumulate_grad_hook_is_refused():
    def build():
        module = M.Mlp()
        module.fc1.bias.register_post_accumulate_grad_hook(lambda p: None)
        return module

    with pytest.raises(cstorch.errors.UnsupportedOpError, match="register_post_accumulate"):
        M.run(build=build, eager=False)


# ---- torch.autograd.grad ----------------------------------------------------------------
def _gradient_penalty(create_graph: bool):
    def body(net, module, optimizer, x, y):
        optimizer.zero_grad()
        x = x.clone().requires_grad_(True)
        out = net(x)
        (gx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=create_graph,
                                    retain_graph=True)
        loss = F.mse_loss(out, y) + 0.1 * gx.pow(2).mean()
        loss.backward()
        optimizer.step()
        return loss

    return body


@pytest.mark.parametrize("create_graph", [True, False])
def test_a_gradient_penalty_on_the_inputs(create_graph):
    """``torch.autograd.grad(out, x, create_graph=True)`` then ``loss.backward()`` with
    the penalty in the loss: the penalty's gradient reaches the weights (R1, WGAN-GP);
    without ``create_graph`` the penalty is a constant of the backward pass. It failed
    with torch's raw "element 0 of tensors does not require grad"."""
    check(_gradient_penalty(create_graph))


def test_an_inputs_gradient_after_loss_backward():
    """``x.requires_grad_()`` before the forward gives ``x.grad`` after ``loss.backward()``
    (a saliency, or an adversarial example's direction)."""
    def body(net, module, optimizer, x, y):
        optimizer.zero_grad()
        x = x.clone().requires_grad_()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            module.fc2.bias.add_(x.grad.abs().mean(0)[:3])
        return loss

    check(body)


def test_gradients_of_two_inputs_in_one_call_with_grad_outputs():
    def body(net, module, optimizer, x, y):
        optimizer.zero_grad()
        a = x.clone().requires_grad_()
        b = (x * 0.5).requires_grad_()
        out = net(a * b)
        ga, gb = torch.autograd.grad(out, (a, b), grad_outputs=torch.ones_like(out),
                                     create_graph=True)
        loss = F.mse_loss(out, y) + 0.05 * (ga * gb).mean()
        torch.autograd.backward(loss)
        optimizer.step()
        return loss

    check(body)


@pytest.mark.parametrize("case, match", [
    ("parameters", "not supported in a traced step"),
    ("twice", "once per step"),
    ("vector", "only for scalar outputs"),
    ("requires_grad of a parameter", "before the step is first called"),
])
def test_autograd_forms_cerebrax_refuses(case, match):
    def body(net, module, optimizer, x, y):
        x = x.clone().requires_grad_()
        out = net(x)
        if case == "parameters":
            torch.autograd.grad(out.sum(), list(module.parameters()))
        elif case == "twice":
            torch.autograd.grad(out.sum(), x)
            torch.autograd.grad(out.mean(), x)
        elif case == "vector":
            torch.autograd.grad(out, x)
        else:
            module.fc1.bias.requires_grad_(False)
        return F.mse_loss(out, y)

    with pytest.raises(cstorch.errors.UnsupportedOpError, match=match):
        M.run(body, eager=False)


# ---- torch.autocast ---------------------------------------------------------------------
U_BF16 = 2.0**-8  # bfloat16's unit roundoff


class _AutocastInForward(M.Mlp):
    """Runs its layers under ``torch.autocast("cpu", bfloat16)`` inside ``forward``."""

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = super().forward(x)
        return h.float()


def _autocast_step(net, module, optimizer, x, y):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x)
        loss = F.mse_loss(out.float(), y)
    loss.backward()
    optimizer.step()
    return loss


@pytest.mark.parametrize("where", ["step", "forward"])
def test_autocast_trains_within_the_bfloat16_bound_of_torchs_autocast(where):
    """``torch.autocast("cpu", dtype=torch.bfloat16)`` around the model call (or inside
    ``forward``): cerebrax applies torch's own autocast (its op lists decide every cast,
    in the exported graph and on the step's torch values), so its error against the
    exact (float64) run is of the size of torch's own autocast run's: at most 3 times it
    plus one bfloat16 rounding of each quantity's largest value. And its error is well
    beyond a float32 run's (more than 3 times it): the casts happen."""
    body, build = ((_autocast_step, M.Mlp) if where == "step"
                   else (plain_step, _AutocastInForward))
    exact = M.run(plain_step, eager=True, float64=True)
    torch_bf16 = M.run(body, eager=True, build=build)
    got = M.run(body, eager=False, build=build)
    excess = M.half_excess(exact, torch_bf16, got, u=U_BF16)
    assert not excess, excess
    float32 = M.run(plain_step, eager=True)
    assert M.half_excess(exact, float32, got, u=0.0), "as accurate as float32: no cast"


def test_a_model_called_with_and_without_autocast_follows_each():
    """One compiled model in a step under autocast and in a step without it: each call
    computes in its own precision (the first call's bfloat16 graph was reused for the
    second, silently)."""
    cstorch.reset()
    torch.manual_seed(0)
    module = M.Mlp()
    net = cstorch.compile(module, cstorch.backend("CPU"))

    @cstorch.trace
    def under_autocast(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return net(x)

    @cstorch.trace
    def without(x):
        return net(x)

    (x, _), = M.batches(1)
    assert under_autocast(x).dtype == torch.bfloat16
    out = without(x)
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), module(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    cstorch.reset()


def test_a_data_write_after_a_step_that_loss_scaling_skips_still_happens():
    """A dynamic loss scaler skips the update of a step whose gradients are not finite,
    and only the update: ``p.data.clamp_`` after ``scaler.step`` still clips (it was
    dropped with the update, and the first step's clip was lost)."""
    def data():
        out = M.batches()
        out[0][0][0, 0] = float("nan")
        return out

    def eager_body(net, module, optimizer, x, y):
        optimizer.zero_grad()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        if all(torch.isfinite(p.grad).all() for p in module.parameters()):
            optimizer.step()
        with torch.no_grad():
            for p in module.parameters():
                p.data.clamp_(-0.2, 0.2)
        return loss

    scalers = []

    def optimizer_and_scaler(module, eager):
        scalers.append(cstorch.amp.GradScaler(loss_scale="dynamic"))
        return M.sgd(module, eager)

    def cerebrax_body(net, module, optimizer, x, y):
        scaler = scalers[-1]
        optimizer.zero_grad()
        loss = F.mse_loss(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        with torch.no_grad():
            for p in module.parameters():
                p.data.clamp_(-0.2, 0.2)
        return loss

    want = M.run(eager_body, eager=True, data=data)
    got = M.run(cerebrax_body, eager=False, data=data, backend="CSX",
                optimizer=optimizer_and_scaler)
    M.assert_same_training(want, got)


# ---- grad mode and the rest of torch's autograd API (the hunt) -------------------------
def _on_output(inner):
    """A step whose loss is ``inner(net, out, x, y)`` of the model's output ``out``."""
    def body(net, module, optimizer, x, y):
        optimizer.zero_grad()
        loss = inner(net, net(x), x, y)
        loss.backward()
        optimizer.step()
        return loss

    return body


def _no_grad_product(net, out, x, y):
    with torch.no_grad():
        target = out * 2
    return F.mse_loss(out * target, y)


def _no_grad_model_call(net, out, x, y):
    with torch.no_grad():
        teacher = net(x * 0.5)
    return F.mse_loss(out, y) + (out * teacher).mean()


def _enable_grad_inside_no_grad(net, out, x, y):
    with torch.no_grad():
        with torch.enable_grad():
            tracked = out * 2
        constant = out * 3
    return F.mse_loss(out * tracked, y) + (out * constant).mean()


def _set_grad_enabled(net, out, x, y):
    torch.set_grad_enabled(False)
    constant = out * 2
    torch.set_grad_enabled(True)
    return F.mse_loss(out * constant, y)


def _inference_mode(net, out, x, y):
    with torch.inference_mode():
        constant = out * 2
    return F.mse_loss(out * constant.clone(), y)


def _detach_in_place(net, out, x, y):
    constant = out * 2
    constant.detach_()
    return F.mse_loss(out * constant, y)


@pytest.mark.parametrize("inner", [_no_grad_product, _no_grad_model_call,
                                   _enable_grad_inside_no_grad, _set_grad_enabled,
                                   _inference_mode, _detach_in_place],
                         ids=lambda f: f.__name__.strip("_"))
def test_torch_grad_mode_in_the_step(inner):
    """Values computed under ``torch.no_grad()`` (``set_grad_enabled(False)``,
    ``inference_mode()``, a model call among them), or ``detach_()``-ed, are constants of
    the backward pass, and ``enable_grad()`` inside ``no_grad`` tracks again (the step's
    torch code ignored grad mode: every one of these trained differently)."""
    check(_on_output(inner))


def test_assigning_and_clearing_a_parameters_grad():
    """``p.grad = p.grad * 0.5`` and ``p.grad = None`` after ``loss.backward()``."""
    def body(net, module, optimizer, x, y):
        optimizer.zero_grad()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        module.fc1.weight.grad = module.fc1.weight.grad * 0.5
        module.fc2.bias.grad = None
        optimizer.step()
        return loss

    check(body)


def test_torch_autograd_functional_vjp_with_create_graph():
    """``torch.autograd.functional.vjp(model, x, v, create_graph=True)``: its gradient
    penalty trains the model (a model's output did not report ``requires_grad``, so
    torch's helper returned zeros without asking cerebrax: the penalty vanished)."""
    def body(net, module, optimizer, x, y):
        optimizer.zero_grad()
        out, vjp = torch.autograd.functional.vjp(net, x, torch.ones(5, 3), create_graph=True)
        loss = F.mse_loss(out, y) + 0.1 * vjp.pow(2).mean()
        loss.backward()
        optimizer.step()
        return loss

    check(body)


def test_a_step_traced_without_autocast_refuses_a_call_under_it():
    """The casts are part of the compiled graph: calling the step under another autocast
    raises instead of running the graph traced without it."""
    cstorch.reset()
    module = M.Mlp()
    net = cstorch.compile(module, cstorch.backend("CPU"))
    step = cstorch.trace(lambda x: net(x))
    (x, _), = M.batches(1)
    step(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(cstorch.errors.RecompileError, match="now called under torch"):
            step(x)
    cstorch.reset()


def test_torch_code_on_parameters_after_a_jax_losss_backward_is_refused():
    """After ``cstorch.backward(loss)`` on a JAX loss the update runs after the step's
    code: a ``p.data`` write there would come before it, not after as written."""
    def body(net, module, optimizer, x, y):
        out = net(jnp.asarray(x))  # JAX in, JAX out
        cstorch.backward(((out - jnp.asarray(y)) ** 2).mean())
        optimizer.step()
        module.fc1.weight.data.clamp_(-0.2, 0.2)
        return torch.zeros(())

    with pytest.raises(cstorch.errors.UnsupportedOpError, match="before the update"):
        M.run(body, eager=False)


class _ReentrantCheckpoint(M.Mlp):
    """``torch.utils.checkpoint(..., use_reentrant=True)`` around a part of ``forward``,
    on the input (which needs no gradient) or on an activation (which does)."""

    def __init__(self, on_input: bool):
        super().__init__()
        self.on_input = on_input

    def forward(self, x):
        if self.on_input:  # torch gives fc1 no gradient here, with a warning
            h = torch.utils.checkpoint.checkpoint(lambda z: torch.tanh(self.fc1(z)), x,
                                                  use_reentrant=True)
        else:
            h = torch.utils.checkpoint.checkpoint(torch.tanh, self.fc1(x), use_reentrant=True)
        return self.fc2(h)


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
@pytest.mark.parametrize("on_input", [True, False], ids=["on_input", "on_activation"])
def test_reentrant_activation_checkpointing(on_input):
    """Reentrant checkpointing trains as torch: the checkpointed part's gradients are its
    own, and none where no input of it requires grad (its no_grad forward stopped every
    gradient, so fc1 never trained)."""
    check(build=lambda: _ReentrantCheckpoint(on_input))


def test_retain_grad_on_an_activation_is_refused():
    """``out.retain_grad()`` then ``out.grad``: cerebrax fills no non-leaf ``.grad``, and
    says what to use instead (``out.grad`` stayed None)."""
    def body(net, module, optimizer, x, y):
        out = net(x)
        out.retain_grad()
        return F.mse_loss(out, y)

    with pytest.raises(cstorch.errors.UnsupportedOpError, match="retain_grad"):
        M.run(body, eager=False)


@pytest.mark.parametrize("case, match", [
    ("data of another shape", "keep their shapes"),
    ("backward with grad_tensors", "without grad_tensors"),
    ("grads batched", "is_grads_batched"),
    ("detach_ on a view", "detach views in place"),
])
def test_further_autograd_forms_cerebrax_refuses(case, match):
    """Each refusal names the fix."""
    def body(net, module, optimizer, x, y):
        out = net(x)
        loss = F.mse_loss(out, y)
        if case == "data of another shape":
            module.fc1.weight.data = torch.zeros(2, 2)
        elif case == "backward with grad_tensors":
            torch.autograd.backward(loss, grad_tensors=torch.ones(()))
        elif case == "grads batched":
            z = x.clone().requires_grad_()
            torch.autograd.grad(net(z).sum(), z, is_grads_batched=True)
        else:
            (out * 2)[0].detach_()
        return loss

    with pytest.raises(cstorch.errors.UnsupportedOpError, match=match):
        M.run(body, eager=False)
