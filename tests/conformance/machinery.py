"""One training step written once, run in torch eager and through a cerebrax traced step.

The tests of torch's own machinery inside a step (``.data`` writes, ``detach()``,
parameter hooks, ``torch.autograd.grad``, ``torch.autocast``, torch.optim objects) each
describe their step as a function ``body(net, module, optimizer, x, y) -> loss``:
``net`` is what the step calls (the torch module in eager, the compiled model under
cerebrax), ``module`` the original torch module (its parameters, its hooks), and
``optimizer`` the optimizer the case builds (``torch.optim.SGD`` in eager and
``cstorch.optim.SGD`` under cerebrax unless the case passes its own factory). :func:`run`
trains :data:`STEPS` steps on the same batches from the same initial weights and returns
the losses and the final weights; :func:`assert_same_training` compares two runs at
float32 (rel 1e-5, as the conformance table).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import cerebrax as cstorch

STEPS = 4


class Mlp(torch.nn.Module):
    """Linear(6, 8), tanh, Linear(8, 3): the conformance suite's small model."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def batches(n: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)) for _ in range(n)]


def sgd(module: torch.nn.Module, eager: bool) -> Any:
    """SGD at lr 0.1: torch's in eager, cstorch's under cerebrax (the same numerics)."""
    return (torch.optim.SGD if eager else cstorch.optim.SGD)(module.parameters(), lr=0.1)


def plain_step(net: Any, module: torch.nn.Module, optimizer: Any, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """``zero_grad``, MSE loss, ``loss.backward()``, ``optimizer.step()``."""
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    optimizer.step()
    return loss


def run(body: Callable = plain_step, *, eager: bool, build: Callable = Mlp,
        optimizer: Callable = sgd, backend: str = "CPU", half: str = "float32",
        data: Callable = batches, float64: bool = False
        ) -> tuple[list[float], dict[str, np.ndarray]]:
    """Trains ``build()`` with ``body`` as the step: ``(losses, final weights)``.

    ``float64``: torch eager with the model and the data in double (the exact run that
    half-precision results are bounded against)."""
    if not eager:
        cstorch.reset()
        cstorch.amp.set_half_dtype(half)
    torch.manual_seed(0)
    module = build()
    if float64:
        module = module.double()
        data = _in_double(data)
    net = module if eager else cstorch.compile(module, cstorch.backend(backend))
    opt = optimizer(module, eager)

    def step(x, y):
        return body(net, module, opt, x, y)

    if not eager:
        step = cstorch.trace(step)
    losses = [float(step(x, y).detach()) for x, y in data()]
    weights = {k: v.detach().double().numpy(force=True) for k, v in module.state_dict().items()}
    if not eager:
        cstorch.reset()
    return losses, weights


def assert_same_training(want: tuple, got: tuple, *, rtol: float = 1e-5,
                         atol: float = 1e-7) -> None:
    """Losses and final weights of two runs equal to ``rtol``."""
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol, err_msg="losses")
    assert sorted(got[1]) == sorted(want[1])
    for name, value in want[1].items():
        np.testing.assert_allclose(got[1][name], value, rtol=rtol, atol=atol, err_msg=name)


def check(body: Callable = plain_step, **kwargs: Any) -> None:
    """``body`` trains through cerebrax as in torch eager (float32, rel 1e-5)."""
    assert_same_training(run(body, eager=True, **kwargs), run(body, eager=False, **kwargs))


def _in_double(data: Callable) -> Callable:
    return lambda: [tuple(t.double() for t in batch) for batch in data()]


def half_excess(exact: tuple, torch_half: tuple, got: tuple, *, u: float,
                k: float = 3.0) -> dict[str, tuple[float, float]]:
    """Where ``got`` is further from the exact run than ``k`` times torch eager's own
    half-precision error on the quantity plus one rounding (``u``, the half dtype's unit
    roundoff) of its largest magnitude, as the conformance table bounds float16
    (``test_table.py``); the losses are one quantity, each weight tensor one. Returns
    ``{quantity: (error, bound)}`` for the quantities beyond it."""
    def quantities(run: tuple) -> dict[str, np.ndarray]:
        return {"losses": np.asarray(run[0], np.float64), **run[1]}

    ref, ours, theirs = quantities(exact), quantities(got), quantities(torch_half)
    excess = {}
    for name, value in ref.items():
        error = float(np.max(np.abs(ours[name] - value)))
        bound = k * float(np.max(np.abs(theirs[name] - value))) + u * float(
            np.max(np.abs(value)))
        if not error <= bound:
            excess[name] = (error, bound)
    return excess
