"""``AdamW``: torch.optim.AdamW as a thin class over :func:`transforms.adamw`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from . import transforms
from ._optax_optimizer import OptaxOptimizer, stack_like

__all__ = ["AdamW"]


class AdamW(OptaxOptimizer):
    """AdamW with torch.optim.AdamW's signature and numerics.

    See :func:`cerebrax.optim.transforms.adamw` for the update rule. ``correct_bias``
    is cstorch's switch for the bias correction. ``foreach``, ``fused`` and
    ``capturable`` are accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> optimizer = cstorch.optim.AdamW(compiled.parameters(), lr=1e-3, weight_decay=0.01)
    """

    _static_hyperparameters = ("betas",)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        correct_bias: bool = True,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ):
        if differentiable:
            raise ConfigError("AdamW(differentiable=True) is not supported by cerebrax")
        if not 0.0 <= lr:
            raise ConfigError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ConfigError(f"Invalid epsilon value: {eps}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ConfigError(f"Invalid beta parameter at index {i}: {beta}")
        if not 0.0 <= weight_decay:
            raise ConfigError(f"Invalid weight_decay value: {weight_decay}")
        del foreach, capturable, fused
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize, correct_bias=correct_bias)
        super().__init__(params, defaults)

    def _transform(self, group: Any):
        b1, b2 = group["betas"]
        return transforms.adamw(
            group["lr"], b1, b2, group["eps"], group["weight_decay"],
            amsgrad=group["amsgrad"], maximize=group["maximize"],
            correct_bias=group["correct_bias"],
        )

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]

    @staticmethod
    def _adam_state(group_state: Any) -> transforms.TorchAdamState:
        return next(p for p in group_state if isinstance(p, transforms.TorchAdamState))

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        adam = self._adam_state(group_state)
        if int(adam.count) == 0:
            return [{} for _ in range(n)]
        out = []
        for j in range(n):
            entry = {"step": np.float32(adam.count), "exp_avg": adam.exp_avg[j],
                     "exp_avg_sq": adam.exp_avg_sq[j]}
            if adam.max_exp_avg_sq != ():
                entry["max_exp_avg_sq"] = adam.max_exp_avg_sq[j]
            out.append(entry)
        return out

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        adam = self._adam_state(template)
        steps = {float(np.asarray(s["step"])) for s in per_param if "step" in s}
        if not steps:
            new = adam._replace(count=jnp.zeros((), jnp.int32))
        else:
            if len(steps) != 1 or any("step" not in s for s in per_param):
                raise ConfigError(
                    "loaded AdamW state has different step counts per parameter; cerebrax "
                    "keeps one step count per param group"
                )
            new = adam._replace(
                count=jnp.asarray(int(steps.pop()), jnp.int32),
                exp_avg=stack_like(adam.exp_avg, [s["exp_avg"] for s in per_param], "exp_avg"),
                exp_avg_sq=stack_like(adam.exp_avg_sq, [s["exp_avg_sq"] for s in per_param],
                                      "exp_avg_sq"),
            )
            if adam.max_exp_avg_sq != ():
                new = new._replace(max_exp_avg_sq=stack_like(
                    adam.max_exp_avg_sq, [s["max_exp_avg_sq"] for s in per_param],
                    "max_exp_avg_sq"))
        return tuple(new if isinstance(p, transforms.TorchAdamState) else p for p in template)
