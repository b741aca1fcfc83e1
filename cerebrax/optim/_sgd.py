"""``SGD``: torch.optim.SGD as a thin class over :func:`transforms.sgd`."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ..errors import ConfigError
from . import transforms
from ._base import ParamsT
from ._optax_optimizer import OptaxOptimizer, stack_like

__all__ = ["SGD"]

_IGNORED_FLAGS = ("foreach", "differentiable", "fused")


class SGD(OptaxOptimizer):
    """Stochastic gradient descent with torch.optim.SGD's signature and numerics.

    See :func:`cerebrax.optim.transforms.sgd` for the update rule. As in cstorch,
    ``lr`` has no default (torch's is ``1e-3``). ``foreach`` and
    ``fused`` are accepted and ignored (the whole step is one fused program);
    ``differentiable=True`` is rejected.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.SGD(compiled.parameters(), lr=0.1, momentum=0.9)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.SGD's state of the weight
      ['momentum_buffer']
    """

    _static_hyperparameters = ("dampening",)

    def __init__(
        self,
        params: ParamsT,
        lr: float,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ):
        if differentiable:
            raise ConfigError("SGD(differentiable=True) is not supported by cerebrax")
        if lr < 0.0:
            raise ConfigError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ConfigError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ConfigError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ConfigError("Nesterov momentum requires a momentum and zero dampening")
        del foreach, fused
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults)

    def _uses_momentum(self, group: Any) -> bool:
        # Whether a group has a momentum buffer is fixed when the optimizer is built.
        flags = getattr(self, "_momentum_flags", None)
        if flags is None:
            flags = self._momentum_flags = [
                float(g._opt._hparams.stored[g._index]["momentum"]) != 0.0
                for g in self.param_groups
            ]
        return flags[group._index]

    def _transform(self, group: Any):
        return transforms.sgd(
            group["lr"], group["momentum"], group["dampening"], group["weight_decay"],
            nesterov=group["nesterov"], maximize=group["maximize"],
            use_momentum=self._uses_momentum(group),
        )

    def state_names_to_sparsify(self) -> list[str]:
        return ["momentum_buffer"]

    @staticmethod
    def _momentum_state(group_state: Any) -> Any:
        for part in group_state:
            if isinstance(part, transforms.MomentumState):
                return part
        return None

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        mom = self._momentum_state(group_state)
        if mom is None or int(mom.count) == 0:
            return [{} for _ in range(n)]
        return [{"momentum_buffer": b} for b in mom.momentum_buffer]

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        mom = self._momentum_state(template)
        if mom is None:
            return template
        present = [s.get("momentum_buffer") is not None for s in per_param]
        if any(present) and not all(present):
            raise ConfigError("loaded SGD state has momentum buffers for only some parameters")
        if not any(present):
            new = mom._replace(count=jnp.zeros((), jnp.int32),
                               momentum_buffer=[jnp.zeros_like(b) for b in mom.momentum_buffer])
        else:
            bufs = stack_like(mom.momentum_buffer, [s["momentum_buffer"] for s in per_param],
                              "momentum_buffer")
            new = mom._replace(count=jnp.ones((), jnp.int32), momentum_buffer=bufs)
        return tuple(new if isinstance(p, transforms.MomentumState) else p for p in template)
