"""``ASGD``: torch.optim.ASGD as a thin class over :func:`transforms.asgd`.

The class validates like torch, builds its group's transformation from
:func:`cerebrax.optim.transforms.asgd`, and maps the transformation's state to and
from torch's per-parameter state dicts; the state NamedTuple uses torch's key
names, with ``count`` standing for torch's ``step``.
"""

from __future__ import annotations

from typing import Any

import optax

from ._base import ParamsT
from ._torch_layout import AdaptiveLayout, check, refuse_differentiable
from .transforms._asgd import ASGDState, asgd

__all__ = ["ASGD"]


class ASGD(AdaptiveLayout):
    """Averaged SGD with torch.optim.ASGD's signature and numerics.

    See :func:`cerebrax.optim.transforms.asgd` for the update rule; the averaged
    parameters are ``state[p]["ax"]`` in :meth:`state_dict`. ``foreach`` and
    ``capturable`` are accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.ASGD(compiled.parameters(), lr=1e-2, t0=100)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.ASGD's state of the weight
      ['ax', 'eta', 'mu', 'step']
    """

    _static_hyperparameters = ("lambd", "alpha", "t0")
    _state_type = ASGDState

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        lambd: float = 1e-4,
        alpha: float = 0.75,
        t0: float = 1e6,
        weight_decay: float = 0,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ):
        refuse_differentiable("ASGD", differentiable)
        check(0.0 <= lr, f"Invalid learning rate: {lr}")
        check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        del foreach, capturable
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _fill(self, field: str) -> float:
        return 1.0 if field == "mu" else 0.0

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return asgd(group["lr"], group["lambd"], group["alpha"], group["t0"],
                    group["weight_decay"], maximize=group["maximize"])

    def state_names_to_sparsify(self) -> list[str]:
        return ["ax"]
