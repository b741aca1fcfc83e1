"""A run saved with cstorch.save and resumed with cstorch.load continues exactly."""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import batches, compiled_mlp, xent

import cerebrax as cstorch


def _build():
    model = compiled_mlp("CSX")
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = cstorch.optim.lr_scheduler.CosineDecayLR(optimizer, 1e-2, 1e-4, total_iters=12)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic", init_scale=2.0**10,
                                    steps_per_increase=3)

    @cstorch.trace
    def step(x, y):
        loss = xent(model(x), y)
        cstorch.amp.optimizer_step(loss, optimizer, scaler, max_gradient_norm=1.0)
        scheduler.step()
        return loss

    return model, optimizer, scheduler, scaler, step


def test_resumed_run_equals_the_uninterrupted_run(tmp_path):
    data = batches(12)
    model, optimizer, scheduler, scaler, step = _build()
    full = [float(step(x, y)) for x, y in data]
    final = model.state_dict()

    cstorch.reset()
    model, optimizer, scheduler, scaler, step = _build()
    first = [float(step(x, y)) for x, y in data[:5]]
    path = tmp_path / "checkpoint_5.mdl"
    cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                  "lr_scheduler": scheduler.state_dict(), "grad_scaler": scaler.state_dict(),
                  "global_step": 5}, path)

    cstorch.reset()
    model, optimizer, scheduler, scaler, step = _build()
    state = cstorch.load(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["lr_scheduler"])
    scaler.load_state_dict(state["grad_scaler"])
    assert state["global_step"] == 5
    rest = [float(step(x, y)) for x, y in data[5:]]
    assert first + rest == full  # bit for bit on the CPU
    chex.assert_trees_all_equal(model.state_dict(), final)


def test_bfloat16_model_state_round_trips(tmp_path):
    params = {"w": jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3) / 7,
              "b": jnp.ones(3, jnp.float16) / 3}
    model = cstorch.compile(cstorch.FunctionalModel(lambda p, x: x @ p["w"], params), "CPU")
    cstorch.save({"model": model.state_dict()}, tmp_path / "bf16.mdl")
    loaded = cstorch.load(tmp_path / "bf16.mdl")["model"]
    for k, v in model.state_dict().items():
        assert loaded[k].dtype == v.dtype
        np.testing.assert_array_equal(loaded[k].view(np.uint16), v.view(np.uint16))
    model.load_state_dict(loaded)


def test_torch_model_state_dict_loads_into_a_compiled_model(tmp_path):
    torch = pytest.importorskip("torch")
    linear = torch.nn.Linear(3, 2)
    params = {"weight": jnp.zeros((2, 3)), "bias": jnp.zeros(2)}
    model = cstorch.compile(cstorch.FunctionalModel(
        lambda p, x: x @ p["weight"].T + p["bias"], params), "CPU")
    torch.save(linear.state_dict(), tmp_path / "linear.pt")
    model.load_state_dict(torch.load(tmp_path / "linear.pt"))
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_allclose(model(x), linear(torch.tensor(x)).detach().numpy(), rtol=1e-6,
                               atol=1e-6)
