"""Gradient clipping inside a traced step (torch.nn.utils.clip_grad_*_ semantics)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp

from .. import _step
from ..errors import ConfigError, StateError
from .._step import deferrable_function
from ..models import resolve_parameter

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _grads(parameters: Any, what: str):
    ctx = _step.active_context()
    if ctx is None or not ctx.has_grads:
        raise StateError(
            f"{what} clips gradients, which exist inside a traced step after "
            "cstorch.backward(loss). Call it there, after backward."
        )
    if isinstance(parameters, _step.Parameter) or resolve_parameter(parameters) is not None:
        parameters = [parameters]
    params = [resolve_parameter(p) for p in parameters]
    if any(p is None for p in params):
        raise ConfigError(f"{what} expects the parameters of a compiled model.")
    return ctx, [p for p in params if ctx.grad_or_none(p) is not None]


@deferrable_function("clip_grad_norm_()")
def clip_grad_norm_(
    parameters: Iterable[Any], max_norm: float, norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
) -> jax.Array:
    """Scales gradients so that their joint ``norm_type`` norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_``: the scale is
    ``min(max_norm / (total_norm + 1e-6), 1)``. Returns the total norm before clipping.
    ``error_if_nonfinite=True`` is rejected: it would read a value inside the step.
    """
    if error_if_nonfinite:
        raise ConfigError(
            "clip_grad_norm_(error_if_nonfinite=True) would read a tensor inside the "
            "step; check the returned norm in a step closure instead."
        )
    ctx, params = _grads(parameters, "clip_grad_norm_()")
    grads = [ctx.grad(p) for p in params]
    if not grads:
        return jnp.zeros((), jnp.float32)
    norm_type = float(norm_type)
    if norm_type == float("inf"):
        total = jnp.max(jnp.stack([jnp.max(jnp.abs(g)).astype(jnp.float32) for g in grads]))
    else:
        per = jnp.stack([
            jnp.sum(jnp.abs(g.astype(jnp.float32)) ** norm_type) for g in grads
        ])
        total = jnp.sum(per) ** (1.0 / norm_type)
    coef = jnp.minimum(max_norm / (total + 1e-6), 1.0)
    for p, g in zip(params, grads):
        ctx.set_grad(p, (g * coef).astype(g.dtype))
    return total


@deferrable_function("clip_grad_value_()")
def clip_grad_value_(parameters: Iterable[Any], clip_value: float) -> None:
    """Clamps every gradient element to ``[-clip_value, clip_value]``."""
    ctx, params = _grads(parameters, "clip_grad_value_()")
    for p in params:
        ctx.set_grad(p, jnp.clip(ctx.grad(p), -clip_value, clip_value))
