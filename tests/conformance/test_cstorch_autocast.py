"""``cstorch.amp.autocast()`` on the CPU backend is torch's own autocast, as cstorch's is.

cstorch's ``autocast`` enters ``torch.autocast(device, half dtype)`` on CPU and GPU, and
Model Zoo's Trainer calls the model under it when its precision section is enabled
(``enable_mixed_precision``, ``set_half_dtype(torch.bfloat16)`` on CPU). A torch model
called under cerebrax's must then cast per operation, as torch eager under
``torch.autocast("cpu", torch.bfloat16)`` does: not the whole call.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cerebrax as cstorch
import machinery as M

U_BF16 = 2.0**-8  # bfloat16's unit roundoff


class _Residual(M.Mlp):
    """The Mlp plus a float32 path autocast leaves in float32 (an elementwise product
    and ``exp``, not on its lists): cast as a whole, the path would be bfloat16."""

    def __init__(self):
        super().__init__()
        self.skip = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3))

    def forward(self, x):
        return super().forward(x) + self.skip * x[:, :3].exp()


def _torch_autocast_step(net, module, optimizer, x, y):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.mse_loss(net(x), y)
    loss.backward()
    optimizer.step()
    return loss


def _cstorch_autocast_step(dtype):
    def body(net, module, optimizer, x, y):
        optimizer.zero_grad()
        with cstorch.amp.autocast(dtype):
            out = net(x)
            assert out.dtype == torch.float32  # torch promotes bfloat16 + float32
            hidden = F.linear(x, module.fc1.weight)
            assert hidden.dtype == torch.bfloat16  # a torch op of the step: cast too
            loss = F.mse_loss(out, y)
        loss.backward()
        optimizer.step()
        return loss
    return body


@pytest.mark.parametrize("policy, dtype", [("bfloat16", None), ("float32", "bfloat16")],
                         ids=["set_half_dtype", "autocast_dtype"])
def test_a_torch_model_under_cstorch_autocast_trains_as_under_torchs(policy, dtype):
    """The Trainer's way (``set_half_dtype`` then ``autocast()``) and the explicit dtype:
    the error against the exact (float64) run is of the size of torch's own autocast
    run's (the conformance table's bound). Casting the whole call put the float32 path
    in bfloat16 and was 20 times further from torch's losses."""
    exact = M.run(M.plain_step, eager=True, float64=True, build=_Residual)
    torch_bf16 = M.run(_torch_autocast_step, eager=True, build=_Residual)
    got = M.run(_cstorch_autocast_step(dtype), eager=False, half=policy, build=_Residual)
    excess = M.half_excess(exact, torch_bf16, got, u=U_BF16)
    assert not excess, excess
    float32 = M.run(M.plain_step, eager=True, build=_Residual)
    assert M.half_excess(exact, float32, got, u=0.0), "as accurate as float32: no cast"


def test_outputs_have_torchs_dtype_and_calls_outside_follow_their_own_precision():
    """Outside a step too: a Linear under autocast returns bfloat16, as in torch; the
    same model called next without it, or under ``torch.autocast`` after a float32
    call, computes as that call asks (the first call's graph was reused for the next,
    silently)."""
    cstorch.reset()
    torch.manual_seed(0)
    module = torch.nn.Linear(16, 8)
    net = cstorch.compile(module, cstorch.backend("CPU"))
    x = torch.randn(4, 16)
    full = module(x).detach().numpy()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = module(x).detach().float().numpy()

    plain = net(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_torch = net(x)
    with cstorch.amp.autocast("bfloat16"):
        under_ours = net(x)
        with cstorch.amp.autocast(enabled=False):
            disabled = net(x)
    after = net(x)

    assert under_torch.dtype == under_ours.dtype == jnp.bfloat16
    for out in (under_torch, under_ours):  # one bfloat16 rounding apart at most
        np.testing.assert_allclose(np.asarray(out, np.float32), half,
                                   rtol=2 * U_BF16, atol=2 * U_BF16 * np.abs(half).max())
    for out in (plain, disabled, after):
        assert out.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(out), full, rtol=1e-5, atol=1e-6)
    cstorch.reset()


def test_a_jax_function_model_still_computes_its_whole_call_in_the_half_dtype():
    """No torch autocast decides for a JAX function: its weights and inputs are cast."""
    cstorch.reset()
    seen = []

    def apply(params, x):
        seen.append(x.dtype)
        return x @ params["w"]

    model = cstorch.compile(cstorch.FunctionalModel(apply, {"w": jnp.ones((4, 2))}), "CPU")
    with cstorch.amp.autocast("bfloat16"):
        out = model(np.ones((2, 4), np.float32))
    assert seen == [jnp.bfloat16] and out.dtype == jnp.float32
    cstorch.reset()


def test_on_the_gpu_backend_a_torch_model_under_autocast_warns_of_the_whole_call_cast(
        monkeypatch):
    """On the GPU backend the whole call is cast (torch's CUDA op lists are not
    applied), and cerebrax says so once rather than train differently without a word."""
    from cerebrax import _precision

    class _Gpu:
        is_cpu, is_gpu, is_csx = False, True, False

    monkeypatch.setattr(_precision, "current_backend", lambda **_: _Gpu())
    with cstorch.amp.autocast("bfloat16"):
        assert not torch.is_autocast_enabled("cpu")
        with pytest.warns(UserWarning, match="(?s)whole call in bfloat16.*CUDA"):
            assert _precision.compute_dtype(torch_model=True) == jnp.bfloat16
        assert _precision.compute_dtype(torch_model=False) == jnp.bfloat16
        with warnings.catch_warnings():  # once per process: not again
            warnings.simplefilter("error")
            assert _precision.compute_dtype(torch_model=True) == jnp.bfloat16
    cstorch.reset()  # a reset process warns again, as one freshly started
    with cstorch.amp.autocast("bfloat16"):
        with pytest.warns(UserWarning, match="whole call in bfloat16"):
            _precision.compute_dtype(torch_model=True)
