"""``AdamW``: torch.optim.AdamW as :class:`Adam` over :func:`transforms.adamw`.

``Adam``'s argument checks and state dict layout, with AdamW's signature: decoupled
weight decay, cstorch's defaults (``eps=1e-6``, ``weight_decay=0.0``; torch's are
``1e-8`` and ``1e-2``) and cstorch's ``correct_bias``.
"""

from __future__ import annotations

from ._adam import Adam
from ._base import ParamsT
from .transforms._adam import adamw

__all__ = ["AdamW"]


class AdamW(Adam):
    """AdamW with torch.optim.AdamW's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.adamw` for the update rule: Adam's, with the
    parameters decayed by ``1 - lr * weight_decay`` instead of an L2 penalty on the
    gradient. ``correct_bias`` is cstorch's switch for the bias correction. ``foreach``,
    ``fused`` and ``capturable`` are accepted and ignored; ``differentiable=True`` is
    rejected.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.AdamW(compiled.parameters(), lr=1e-3, weight_decay=0.01)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.AdamW's state of the weight
      ['exp_avg', 'exp_avg_sq', 'step']
    """

    _factory = staticmethod(adamw)
    _group_options = ("correct_bias",)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        correct_bias: bool = True,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ):
        del foreach, capturable, fused
        self._init_adam(
            "AdamW", params, lr, betas, eps, weight_decay, amsgrad, maximize, differentiable,
            correct_bias=correct_bias,
        )
