"""``Adagrad``: torch.optim.Adagrad as a thin class over :func:`transforms.adagrad`.

The class validates like torch, builds its group's transformation from
:func:`cerebrax.optim.transforms.adagrad`, and maps the transformation's state to and
from torch's per-parameter state dicts; the state NamedTuple uses torch's key
names, with ``count`` standing for torch's ``step``.
"""

from __future__ import annotations

from typing import Any

import optax

from ._base import ParamsT
from ._torch_layout import AdaptiveLayout, check, refuse_differentiable
from .transforms._adagrad import AdagradState, adagrad

__all__ = ["Adagrad"]


class Adagrad(AdaptiveLayout):
    """Adagrad with torch.optim.Adagrad's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.adagrad` for the update rule. The defaults are
    cstorch's: ``eps=1e-6`` (torch's is ``1e-10``). As in torch,
    every group's accumulator starts at the constructor's
    ``initial_accumulator_value`` and the state exists before the first step.
    ``foreach`` and ``fused`` are accepted and ignored; ``differentiable=True`` is
    rejected.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.Adagrad(compiled.parameters(), lr=1e-2)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.Adagrad's state of the weight
      ['step', 'sum']
    """

    _static_hyperparameters = ("initial_accumulator_value",)
    _state_type = AdagradState
    _state_before_first_step = True

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        lr_decay: float = 0,
        weight_decay: float = 0,
        initial_accumulator_value: float = 0,
        eps: float = 1e-6,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ):
        refuse_differentiable("Adagrad", differentiable)
        check(0.0 <= lr, f"Invalid learning rate: {lr}")
        check(0.0 <= lr_decay, f"Invalid lr_decay value: {lr_decay}")
        check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        check(0.0 <= initial_accumulator_value,
               f"Invalid initial_accumulator_value value: {initial_accumulator_value}")
        check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        del foreach, fused
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _fill(self, field: str) -> float:
        return float(self.defaults["initial_accumulator_value"])

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return adagrad(
            group["lr"], group["lr_decay"], group["weight_decay"],
            self.defaults["initial_accumulator_value"], group["eps"],
            maximize=group["maximize"],
        )

    def state_names_to_sparsify(self) -> list[str]:
        return ["sum"]
