"""``Rprop``: torch.optim.Rprop as a thin class over :func:`transforms.rprop`.

The class validates like torch, builds its group's transformation from
:func:`cerebrax.optim.transforms.rprop`, and maps the transformation's state to and
from torch's per-parameter state dicts; the state NamedTuple uses torch's key
names, with ``count`` standing for torch's ``step``.
"""

from __future__ import annotations

from typing import Any

import optax

from ._base import ParamsT
from ._torch_layout import AdaptiveLayout, check, refuse_differentiable
from .transforms._rprop import RpropState, rprop

__all__ = ["Rprop"]


class Rprop(AdaptiveLayout):
    """Rprop with torch.optim.Rprop's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.rprop` for the update rule; ``lr`` is only
    the initial step size, read at the first step. The defaults are cstorch's:
    ``lr=1e-3`` (torch's is ``1e-2``). ``foreach`` and ``capturable`` are
    accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.Rprop(compiled.parameters(), lr=1e-2, etas=(0.5, 1.2))
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.Rprop's state of the weight
      ['prev', 'step', 'step_size']
    """

    _state_type = RpropState

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-6, 50.0),
        *,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        refuse_differentiable("Rprop", differentiable)
        check(0.0 <= lr, f"Invalid learning rate: {lr}")
        check(0.0 < etas[0] < 1.0 < etas[1], f"Invalid eta values: {etas[0]}, {etas[1]}")
        del foreach, capturable
        defaults = dict(lr=lr, etas=tuple(etas), step_sizes=tuple(step_sizes),
                        maximize=maximize)
        super().__init__(params, defaults)

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return rprop(group["lr"], group["etas"], group["step_sizes"],
                     maximize=group["maximize"])

    def state_names_to_sparsify(self) -> list[str]:
        return ["prev", "step_size"]
