"""``amp.optimizer_step``: the usual backward, unscale, clip, step, update sequence."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..optim._clip import clip_grad_norm_, clip_grad_value_
from .._step import backward
from ._grad_scaler import GradScaler

__all__ = ["optimizer_step"]


def optimizer_step(
    loss: Any,
    optimizer: Any,
    grad_scaler: GradScaler | None = None,
    max_gradient_norm: float | None = None,
    max_gradient_value: float | None = None,
) -> None:
    """Backward pass and optimizer update, with optional loss scaling and clipping.

    Equivalent to::

        optimizer.zero_grad()
        grad_scaler.scale(loss).backward()      # or cstorch.backward(loss)
        grad_scaler.unscale_(optimizer)
        clip_grad_norm_(params, max_gradient_norm)   # or clip_grad_value_
        grad_scaler.step(optimizer)             # or optimizer.step()
        grad_scaler.update()
    """
    if max_gradient_norm is not None and max_gradient_value is not None:
        raise ConfigError(
            "optimizer_step() got both max_gradient_norm and max_gradient_value; clip by "
            "norm or by value, not both."
        )
    for name, value in (("max_gradient_norm", max_gradient_norm),
                        ("max_gradient_value", max_gradient_value)):
        if value is not None and not value > 0:
            raise ConfigError(f"optimizer_step({name}={value!r}) must be > 0")
    optimizer.zero_grad()
    if grad_scaler is not None:
        grad_scaler.scale(loss).backward()
        grad_scaler.unscale_(optimizer)
    else:
        backward(loss)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if max_gradient_norm is not None:
        clip_grad_norm_(params, max_gradient_norm)
    elif max_gradient_value is not None:
        clip_grad_value_(params, max_gradient_value)
    if grad_scaler is not None:
        grad_scaler.step(optimizer)
        grad_scaler.update()
    else:
        optimizer.step()
