"""``Adam``: torch.optim.Adam as a thin class over :func:`transforms.adam`.

The class validates torch's arguments with torch's messages (the checks the other Adam
family classes share) and builds :func:`cerebrax.optim.transforms.adam` per param
group; the update math lives there. Its state dict uses torch's per-parameter keys;
cerebrax keeps one step count per param group, written to every parameter's entry.
``AdamW`` is this class with another factory and its own signature.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ._base import ParamsT
from ._torch_layout import AdamLayout, refuse_differentiable
from .transforms._adam import TorchAdamState, adam

__all__ = ["Adam"]


def check_adam_arguments(
    lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> None:
    """torch's checks, in torch's order and words."""
    if not 0.0 <= lr:
        raise ConfigError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ConfigError(f"Invalid epsilon value: {eps}")
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ConfigError(f"Invalid beta parameter at index {i}: {beta}")
    if not 0.0 <= weight_decay:
        raise ConfigError(f"Invalid weight_decay value: {weight_decay}")


class Adam(AdamLayout):
    """Adam with torch.optim.Adam's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.adam` for the update rule. The defaults are
    cstorch's: ``eps=1e-6`` (torch's is ``1e-8``). ``weight_decay``
    is an L2 penalty on the gradient, or decoupled (AdamW) with
    ``decoupled_weight_decay=True``. ``foreach``, ``fused`` and ``capturable`` are
    accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.Adam(compiled.parameters(), lr=1e-3)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.Adam's state of the weight
      ['exp_avg', 'exp_avg_sq', 'step']
    """

    _static_hyperparameters = ("betas",)
    _state_type = TorchAdamState
    _factory = staticmethod(adam)  # the optax factory of a param group
    _group_options = ("decoupled_weight_decay",)  # its options past Adam's shared ones

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ):
        del foreach, capturable, fused
        self._init_adam(
            "Adam", params, lr, betas, eps, weight_decay, amsgrad, maximize, differentiable,
            decoupled_weight_decay=decoupled_weight_decay,
        )

    def _init_adam(
        self,
        name: str,
        params: ParamsT,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        amsgrad: bool,
        maximize: bool,
        differentiable: bool,
        **options: Any,
    ) -> None:
        """Checks torch's arguments and sets the param group defaults.

        The defaults are ``lr``, ``betas``, ``eps``, ``weight_decay``, ``amsgrad``,
        ``maximize`` and then ``options``, the class's :attr:`_group_options`; ``name``
        is the class's name in the ``differentiable=True`` refusal.
        """
        refuse_differentiable(name, differentiable)
        check_adam_arguments(lr, betas, eps, weight_decay)
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            **options,
        )
        super().__init__(params, defaults)

    def _transform(self, group: Any):
        b1, b2 = group["betas"]
        return self._factory(
            group["lr"],
            b1,
            b2,
            group["eps"],
            group["weight_decay"],
            amsgrad=group["amsgrad"],
            maximize=group["maximize"],
            **{option: group[option] for option in self._group_options},
        )
