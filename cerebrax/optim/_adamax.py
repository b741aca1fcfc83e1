"""``Adamax``: torch.optim.Adamax as a thin class over :func:`transforms.adamax`.

The class validates torch's arguments with torch's messages and builds
:func:`cerebrax.optim.transforms.adamax` per param group; the update math lives there.
Its state dict uses torch's per-parameter keys; cerebrax keeps one step count per param
group, written to every parameter's entry.
"""

from __future__ import annotations

from typing import Any

from ._adam import check_adam_arguments
from ._base import ParamsT
from ._torch_layout import AdamLayout, refuse_differentiable
from .transforms._adamax import TorchAdamaxState, adamax

__all__ = ["Adamax"]


class Adamax(AdamLayout):
    """Adamax with torch.optim.Adamax's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.adamax` for the update rule. The defaults are
    cstorch's: ``lr=1e-3``, ``eps=1e-6`` (torch's are ``2e-3`` and ``1e-8``). ``foreach`` and
    ``capturable`` are accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.Adamax(compiled.parameters(), lr=1e-3)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.Adamax's state of the weight
      ['exp_avg', 'exp_inf', 'step']
    """

    _static_hyperparameters = ("betas",)
    _state_type = TorchAdamaxState

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ):
        refuse_differentiable("Adamax", differentiable)
        check_adam_arguments(lr, betas, eps, weight_decay)
        del foreach, capturable
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, maximize=maximize
        )
        super().__init__(params, defaults)

    def _transform(self, group: Any):
        b1, b2 = group["betas"]
        return adamax(
            group["lr"], b1, b2, group["eps"], group["weight_decay"], maximize=group["maximize"]
        )
