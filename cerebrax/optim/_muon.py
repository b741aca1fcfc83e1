"""``Muon``: cstorch's Muon as a thin class over :func:`transforms.muon`."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import optax

from ..errors import ConfigError
from ._base import ParamsT
from ._optax_optimizer import OptaxOptimizer, stack_like
from .transforms._muon import MuonState, check_ns_steps, muon

__all__ = ["Muon"]


class Muon(OptaxOptimizer):
    """Muon with cstorch's signature and defaults.

    See :func:`cerebrax.optim.transforms.muon` for the update rule: heavy-ball momentum
    with a Nesterov blend, orthogonalized by ``ns_steps`` quintic Newton-Schulz
    iterations and scaled by ``sqrt(max(1, rows / cols))``, with decoupled weight decay
    ``p * (1 - lr * weight_decay)``.

    Muon is meant for the hidden layers' weight matrices. Other parameters are
    accepted, so a cstorch configuration that hands every parameter to Muon runs:
    0-D and 1-D parameters (biases, norm gains) take the plain momentum step (the same
    momentum, Nesterov blend, ``lr`` and weight decay, without orthogonalization), and
    parameters with more than two dimensions are orthogonalized as
    ``(shape[0], prod(shape[1:]))``. To train those with AdamW instead, give them to a
    second optimizer.

    The state dict holds ``momentum_buffer`` per parameter, as ``torch.optim.Muon``'s.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.Muon(compiled.parameters(), lr=0.02)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.Muon's state of the weight
      ['momentum_buffer']
    """

    _static_hyperparameters = ("ns_steps",)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.02,
        weight_decay: float = 0.01,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
    ):
        if not 0.0 <= lr:
            raise ConfigError(f"Invalid learning rate: {lr}")
        if not 0.0 <= weight_decay:
            raise ConfigError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= momentum:
            raise ConfigError(f"Invalid momentum value: {momentum}")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                        nesterov=nesterov, ns_steps=check_ns_steps(ns_steps))
        super().__init__(params, defaults)

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return muon(group["lr"], group["momentum"], group["weight_decay"],
                    nesterov=group["nesterov"], ns_steps=group["ns_steps"])

    def state_names_to_sparsify(self) -> list[str]:
        return ["momentum_buffer"]

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        state = group_state[0]
        if int(state.count) == 0:
            return [{} for _ in range(n)]
        return [{"momentum_buffer": b} for b in state.momentum_buffer]

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        state = template[0]
        present = [s.get("momentum_buffer") is not None for s in per_param]
        if any(present) and not all(present):
            raise ConfigError(
                "loaded Muon state has momentum buffers for only some parameters of a group; "
                "save and load the whole optimizer"
            )
        if any(present):
            bufs = stack_like(state.momentum_buffer,
                              [s["momentum_buffer"] for s in per_param], "momentum_buffer")
            new = MuonState(jnp.ones((), jnp.int32), bufs)
        else:
            new = MuonState(jnp.zeros((), jnp.int32),
                            [jnp.zeros_like(b) for b in state.momentum_buffer])
        return (new, *template[1:])
