"""``RMSprop``: torch.optim.RMSprop as a thin class over :func:`transforms.rmsprop`.

The class validates like torch, builds its group's transformation from
:func:`cerebrax.optim.transforms.rmsprop`, and maps the transformation's state to and
from torch's per-parameter state dicts; the state NamedTuple uses torch's key
names, with ``count`` standing for torch's ``step``.
"""

from __future__ import annotations

from typing import Any

import optax

from ._base import ParamsT
from ._torch_layout import AdaptiveLayout, check, refuse_differentiable
from .transforms._rmsprop import RMSpropState, rmsprop

__all__ = ["RMSprop"]


class RMSprop(AdaptiveLayout):
    """RMSprop with torch.optim.RMSprop's signature and numerics.

    See :func:`cerebrax.optim.transforms.rmsprop` for the update rule. Whether a group
    keeps a momentum buffer is fixed by its momentum when the optimizer is built.
    ``foreach`` and ``capturable`` are accepted and ignored; ``differentiable=True``
    is rejected.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.RMSprop(compiled.parameters(), lr=1e-2, momentum=0.9)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.RMSprop's state of the weight
      ['momentum_buffer', 'square_avg', 'step']
    """

    _static_hyperparameters = ("alpha",)
    _state_type = RMSpropState

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        refuse_differentiable("RMSprop", differentiable)
        check(0.0 <= lr, f"Invalid learning rate: {lr}")
        check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        check(0.0 <= momentum, f"Invalid momentum value: {momentum}")
        check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        check(0.0 <= alpha, f"Invalid alpha value: {alpha}")
        del foreach, capturable
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults)

    def _uses_momentum(self, group: Any) -> bool:
        # Whether a group has a momentum buffer is fixed when the optimizer is built.
        flags = getattr(self, "_momentum_flags", None)
        if flags is None:
            flags = self._momentum_flags = [
                float(g._opt._hparams.stored[g._index]["momentum"]) > 0.0
                for g in self.param_groups
            ]
        return flags[group._index]

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return rmsprop(
            group["lr"], group["alpha"], group["eps"], group["weight_decay"],
            group["momentum"], centered=group["centered"], maximize=group["maximize"],
            use_momentum=self._uses_momentum(group),
        )

    def state_names_to_sparsify(self) -> list[str]:
        return ["square_avg", "momentum_buffer", "grad_avg"]
