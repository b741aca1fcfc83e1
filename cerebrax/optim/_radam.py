"""``RAdam``: torch.optim.RAdam as a thin class over :func:`transforms.radam`.

The class validates torch's arguments with torch's messages and builds
:func:`cerebrax.optim.transforms.radam` per param group; the update math lives there.
Its state dict uses torch's per-parameter keys; cerebrax keeps one step count per param
group, written to every parameter's entry.
"""

from __future__ import annotations

from typing import Any

from ._adam import check_adam_arguments
from ._base import ParamsT
from ._torch_layout import AdamLayout, refuse_differentiable
from .transforms._radam import TorchRAdamState, radam

__all__ = ["RAdam"]


class RAdam(AdamLayout):
    """RAdam with torch.optim.RAdam's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.radam` for the update rule. The defaults are
    cstorch's: ``eps=1e-6`` (torch's is ``1e-8``). ``foreach`` and
    ``capturable`` are accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.RAdam(compiled.parameters(), lr=1e-3)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.RAdam's state of the weight
      ['exp_avg', 'exp_avg_sq', 'step']
    """

    _static_hyperparameters = ("betas",)
    _state_type = TorchRAdamState

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ):
        refuse_differentiable("RAdam", differentiable)
        check_adam_arguments(lr, betas, eps, weight_decay)
        del foreach, capturable
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            decoupled_weight_decay=decoupled_weight_decay,
            maximize=maximize,
        )
        super().__init__(params, defaults)

    def _transform(self, group: Any):
        b1, b2 = group["betas"]
        return radam(
            group["lr"],
            b1,
            b2,
            group["eps"],
            group["weight_decay"],
            maximize=group["maximize"],
            decoupled_weight_decay=group["decoupled_weight_decay"],
        )
