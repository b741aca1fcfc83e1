"""``Adadelta``: torch.optim.Adadelta as a thin class over :func:`transforms.adadelta`.

The class validates like torch, builds its group's transformation from
:func:`cerebrax.optim.transforms.adadelta`, and maps the transformation's state to and
from torch's per-parameter state dicts; the state NamedTuple uses torch's key
names, with ``count`` standing for torch's ``step``.
"""

from __future__ import annotations

from typing import Any

import optax

from ._base import ParamsT
from ._torch_layout import AdaptiveLayout, check, refuse_differentiable
from .transforms._adadelta import AdadeltaState, adadelta

__all__ = ["Adadelta"]


class Adadelta(AdaptiveLayout):
    """Adadelta with torch.optim.Adadelta's signature and numerics.

    See :func:`cerebrax.optim.transforms.adadelta` for the update rule. ``foreach``
    and ``capturable`` are accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.Adadelta(compiled.parameters(), lr=1.0, rho=0.9)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.Adadelta's state of the weight
      ['acc_delta', 'square_avg', 'step']
    """

    _static_hyperparameters = ("rho",)
    _state_type = AdadeltaState

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0,
        foreach: bool | None = None,
        *,
        capturable: bool = False,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        refuse_differentiable("Adadelta", differentiable)
        check(0.0 <= lr, f"Invalid learning rate: {lr}")
        check(0.0 <= rho <= 1.0, f"Invalid rho value: {rho}")
        check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        del foreach, capturable
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults)

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return adadelta(group["lr"], group["rho"], group["eps"],
                        group["weight_decay"], maximize=group["maximize"])

    def state_names_to_sparsify(self) -> list[str]:
        return ["square_avg", "acc_delta"]
