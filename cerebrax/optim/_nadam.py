"""``NAdam``: torch.optim.NAdam as a thin class over :func:`transforms.nadam`.

The class validates torch's arguments with torch's messages and builds
:func:`cerebrax.optim.transforms.nadam` per param group; the update math lives there.
Its state dict uses torch's per-parameter keys; cerebrax keeps one step count and one
``mu_product`` per param group, written to every parameter's entry.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ._adam import check_adam_arguments
from ._base import ParamsT
from ._torch_layout import AdamLayout, refuse_differentiable
from .transforms._nadam import TorchNAdamState, nadam

__all__ = ["NAdam"]


class NAdam(AdamLayout):
    """NAdam with torch.optim.NAdam's signature and numerics.

    See :func:`cerebrax.optim.transforms.nadam` for the update rule. ``betas`` and
    ``momentum_decay`` are part of the compiled step; ``foreach`` and ``capturable``
    are accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.NAdam(compiled.parameters(), lr=2e-3)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.NAdam's state of the weight
      ['exp_avg', 'exp_avg_sq', 'mu_product', 'step']
    """

    _static_hyperparameters = ("betas", "momentum_decay")
    _state_type = TorchNAdamState
    _scalar_fields = ("mu_product",)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum_decay: float = 4e-3,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ):
        refuse_differentiable("NAdam", differentiable)
        check_adam_arguments(lr, betas, eps, weight_decay)
        if not 0.0 <= momentum_decay:
            raise ConfigError(f"Invalid momentum_decay value: {momentum_decay}")
        del foreach, capturable
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            momentum_decay=momentum_decay,
            decoupled_weight_decay=decoupled_weight_decay,
            maximize=maximize,
        )
        super().__init__(params, defaults)

    def _transform(self, group: Any):
        b1, b2 = group["betas"]
        return nadam(
            group["lr"],
            b1,
            b2,
            group["eps"],
            group["weight_decay"],
            group["momentum_decay"],
            maximize=group["maximize"],
            decoupled_weight_decay=group["decoupled_weight_decay"],
        )
