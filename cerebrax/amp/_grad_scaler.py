"""``GradScaler``: cstorch's static and dynamic loss scaling.

Loss scaling is active on the CSX backend, where the model computes in a half dtype;
on CPU and GPU (float32) ``scale`` returns the loss unchanged and ``state_dict`` is
empty, as in cstorch. Dynamic scaling skips a step whose gradients are not finite:
parameters, optimizer state and scheduler counters keep their values, and the scale
is halved once overflows exceed ``overflow_tolerance``.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp

from .. import _step
from .._filters import is_torch_tensor
from .._precision import get_half_dtype_str
from .._step import (
    ActiveContext,
    as_jax,
    backward,
    context_with_grads,
    deferrable,
    deferrable_function,
)
from ..backend import current_backend
from ..errors import ConfigError, StateError
from ..models import resolve_parameter

__all__ = ["GradScaler", "ScaledLoss", "isfinite", "update_if_finite"]

_MIN_LOSS_SCALE = 2.0**-14


def _default_max_loss_scale() -> float:
    """cstorch's default maximum (and initial) dynamic scale: 2**31 for cbfloat16,
    whose range is twice float16's, else 2**15."""
    return 2.0**31 if get_half_dtype_str() == "cbfloat16" else 2.0**15


class ScaledLoss:
    """The scaled loss returned by :meth:`GradScaler.scale`; call ``.backward()``."""

    def __init__(self, value: jax.Array):
        self.value = value

    def backward(self) -> None:
        backward(self.value)

    def __jax_array__(self) -> jax.Array:
        return self.value


class GradScaler:
    """Loss scaling for half-precision gradients (cstorch's ``amp.GradScaler``).

    As in cstorch, scaling is active on the CSX backend only (where the model computes
    in a half dtype); on CPU and GPU ``scale`` returns the loss as it is, ``step`` just
    steps the optimizer and ``state_dict()`` is empty, so one script runs everywhere.

    Args:
      loss_scale: ``"dynamic"`` for dynamic loss scaling, a number for a static scale,
        or None / 0 for no scaling.
      init_scale: the first dynamic scale (default 2**15, 2**31 when the half dtype is
        cbfloat16; capped by ``max_loss_scale``).
      steps_per_increase: finite steps after which the dynamic scale doubles (2000).
      min_loss_scale: lower bound of the dynamic scale (default and minimum 2**-14).
      max_loss_scale: upper bound of the dynamic scale (default 2**15, 2**31 for
        cbfloat16).
      overflow_tolerance: the fraction of overflowing steps tolerated before halving.
      max_gradient_norm: deprecated; use ``amp.optimizer_step(max_gradient_norm=...)``.
        Only :meth:`clip_gradients_and_return_isfinite` applies it, as cstorch does.

    Usage inside a traced step::

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)            # optional, e.g. before clipping
        scaler.step(optimizer)                # skipped when gradients are not finite
        scaler.update()
    """

    def __init__(
        self,
        loss_scale: str | float | None = None,
        init_scale: float | None = None,
        steps_per_increase: int | None = None,
        min_loss_scale: float | None = None,
        max_loss_scale: float | None = None,
        overflow_tolerance: float = 0.0,
        max_gradient_norm: float | None = None,
    ):
        if max_gradient_norm:
            warnings.warn(
                "GradScaler(max_gradient_norm=...) is deprecated: only "
                "GradScaler.clip_gradients_and_return_isfinite() applies it. Pass "
                "max_gradient_norm to cstorch.amp.optimizer_step instead.",
                DeprecationWarning, stacklevel=2,
            )
        self.max_gradient_norm = float(max_gradient_norm) if max_gradient_norm else None
        self.dynamic = loss_scale == "dynamic"
        if isinstance(loss_scale, str) and not self.dynamic:
            raise ConfigError(
                f"GradScaler(loss_scale=...) must be 'dynamic' or a number, got {loss_scale!r}"
            )
        self.steps_per_increase = int(steps_per_increase or 2000)
        self.min_loss_scale = float(min_loss_scale or _MIN_LOSS_SCALE)
        self.max_loss_scale = float(max_loss_scale or _default_max_loss_scale())
        self.overflow_tolerance = float(overflow_tolerance or 0.0)
        if self.dynamic:
            if self.min_loss_scale < _MIN_LOSS_SCALE:
                raise ConfigError(
                    f"min_loss_scale too small: {self.min_loss_scale} < 2**-14 (the smallest "
                    "float16 normal)."
                )
            if self.overflow_tolerance < 0:
                raise ConfigError(f"overflow_tolerance must be >= 0, got {overflow_tolerance}")
            if self.steps_per_increase < 1:
                raise ConfigError(f"steps_per_increase must be >= 1, got {steps_per_increase}")
            scale = min(self.max_loss_scale, float(init_scale or _default_max_loss_scale()))
        else:
            scale = float(loss_scale or 1.0)
            if scale <= 0:
                raise ConfigError(f"a static loss_scale must be > 0, got {loss_scale!r}")
        self._state = _step.StateRef(
            {
                "loss_scale": jnp.float32(scale),
                "non_clamped_loss_scale": jnp.float32(scale),
                "steps_since_rescale": jnp.int32(0),
                "overflows_since_rescale": jnp.int32(0),
                "num_skipped_steps": jnp.int32(0),
            },
            name="GradScaler",
        )

    # ---- helpers ---------------------------------------------------------------------
    @staticmethod
    def _active() -> bool:

        backend = current_backend(raise_exception=False)
        return backend is not None and backend.is_csx

    def _scratch(self, ctx: ActiveContext) -> dict:
        return ctx.record(
            ("grad_scaler", id(self)), {"unscaled": {}, "stepped": set(), "updated": False}
        )

    @staticmethod
    def _context(what: str) -> ActiveContext:
        ctx = _step.active_context()
        if ctx is None:
            raise StateError(f"GradScaler.{what} must be called inside a @cstorch.trace step.")
        return ctx

    def get_scale(self) -> jax.Array:
        """The current loss scale (a traced value inside a step)."""
        return self._state.value["loss_scale"]

    def get_non_clamped_scale(self) -> jax.Array:
        """The dynamic scale of the last update before it was raised to
        ``min_loss_scale`` (after the cap at ``max_loss_scale``).

        A value below ``min_loss_scale`` means the updates keep halving a scale that is
        already at its floor: the gradients stay non-finite whatever the scale. For a
        static scale (or none) it is the scale itself.
        """
        key = "non_clamped_loss_scale" if self.dynamic else "loss_scale"
        return self._state.value[key]

    def get_num_skipped_steps(self) -> jax.Array:
        """How many optimizer steps dynamic loss scaling skipped so far (0 if static)."""
        return self._state.value["num_skipped_steps"]

    def _finite(self, scratch: dict) -> jax.Array:
        """Whether the gradients of every optimizer unscaled in this step are finite."""
        finite = jnp.bool_(True)
        for flag in scratch["unscaled"].values():
            finite = jnp.logical_and(finite, flag)
        return finite

    # ---- the step API ---------------------------------------------------------------
    def scale(self, loss: Any) -> Any:
        """``loss * scale`` in float32 (the loss itself when scaling is inactive).

        A torch loss (in a torch-native step) gives a torch tensor, whose
        ``.backward()`` is torch's; a JAX loss gives a :class:`ScaledLoss`.
        """
        torch_loss = is_torch_tensor(loss)
        loss = jnp.asarray(as_jax(loss))
        if self._active():
            loss = loss.astype(jnp.float32) * self.get_scale()
        if torch_loss:
            from torch_bridge import JaxTensor

            return JaxTensor(loss)
        return ScaledLoss(loss)

    @deferrable("GradScaler.unscale_()")
    def unscale_(self, optimizer: Any) -> None:
        """Divides the gradients of ``optimizer``'s parameters by the scale."""
        ctx = self._context("unscale_()")
        scratch = self._scratch(ctx)
        if id(optimizer) in scratch["stepped"]:
            raise StateError("unscale_() is being called after step().")
        if id(optimizer) in scratch["unscaled"]:
            raise StateError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        ctx = context_with_grads("GradScaler.unscale_()")
        params = [p for p in _parameters(optimizer) if ctx.grad_or_none(p) is not None]
        if not self._active():
            scratch["unscaled"][id(optimizer)] = jnp.bool_(True)
            return
        inv = 1.0 / self.get_scale()
        for p in params:
            g = ctx.grad(p)
            ctx.set_grad(p, (g.astype(jnp.float32) * inv).astype(g.dtype))
        sq = sum((jnp.sum(jnp.square(ctx.grad(p).astype(jnp.float32))) for p in params),
                 jnp.float32(0))
        # sqrt(inf) = inf and NaN compares false: both mark the step as overflowed.
        scratch["unscaled"][id(optimizer)] = jnp.sqrt(sq) < jnp.inf

    @deferrable("GradScaler.step()")
    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscales (if not done yet) and steps ``optimizer``; skipped if not finite."""
        ctx = self._context("step()")
        scratch = self._scratch(ctx)
        if id(optimizer) in scratch["stepped"]:
            raise StateError("step() has already been called since the last update().")
        if id(optimizer) not in scratch["unscaled"]:
            self.unscale_(optimizer)
        return self._step_if(scratch["unscaled"][id(optimizer)], optimizer, args, kwargs)

    @deferrable("GradScaler.step_if_finite()")
    def step_if_finite(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Steps ``optimizer`` only if the gradients unscaled in this step are finite.

        Unlike :meth:`step` it unscales nothing itself: it conditions the step on what
        :meth:`unscale_` (or :meth:`clip_gradients_and_return_isfinite`) found for the
        optimizers unscaled so far in this step. With a static scale (or inactive
        scaling, on CPU and GPU) the optimizer always steps.
        """
        ctx = self._context("step_if_finite()")
        scratch = self._scratch(ctx)
        if not scratch["unscaled"] and self._active() and self.dynamic:
            raise StateError(
                "GradScaler.step_if_finite() needs to know whether the gradients are "
                "finite: call scaler.unscale_(optimizer) or "
                "scaler.clip_gradients_and_return_isfinite([optimizer]) before it, or "
                "use scaler.step(optimizer), which unscales first."
            )
        return self._step_if(self._finite(scratch), optimizer, args, kwargs)

    def _step_if(self, finite: jax.Array, optimizer: Any, args: tuple, kwargs: dict) -> Any:
        ctx = self._context("step()")
        self._scratch(ctx)["stepped"].add(id(optimizer))
        ctx.set_record(("isfinite", id(optimizer)), finite)  # for amp.isfinite(optimizer)
        if not (self._active() and self.dynamic):
            return optimizer.step(*args, **kwargs)
        ctx.skip_writes_unless(finite)
        result = optimizer.step(*args, **kwargs)
        # Later skippable writes of this step (scheduler steps) are skipped as well.
        state = dict(self._state.value)
        state["num_skipped_steps"] = state["num_skipped_steps"] + (~finite).astype(jnp.int32)
        self._state.value = state
        return result

    @deferrable("GradScaler.clip_gradients_and_return_isfinite()")
    def clip_gradients_and_return_isfinite(self, optimizers: Any) -> jax.Array:
        """Unscales the optimizers' gradients and returns whether all are finite.

        Every optimizer of ``optimizers`` (one or a list) not unscaled yet in this step
        is unscaled. The result is True when the global norm of their gradients is
        finite (always True when scaling is inactive). With the deprecated
        ``max_gradient_norm`` the gradients are then scaled by
        ``min(1, max_gradient_norm / (norm + 1e-6))``, torch's ``clip_grad_norm_``.
        """
        ctx = self._context("clip_gradients_and_return_isfinite()")
        scratch = self._scratch(ctx)
        optimizers = [optimizers] if hasattr(optimizers, "param_groups") else list(optimizers)
        for optimizer in optimizers:
            if id(optimizer) not in scratch["unscaled"]:
                self.unscale_(optimizer)
        if self.max_gradient_norm is not None:
            self._clip(optimizers)
        return self._finite(scratch)

    def _clip(self, optimizers: list) -> None:
        pairs = []
        for optimizer in optimizers:
            ctx = context_with_grads("GradScaler.clip_gradients_and_return_isfinite()")
            pairs += [(ctx, p) for p in _parameters(optimizer)
                      if ctx.grad_or_none(p) is not None]
        sq = sum((jnp.sum(jnp.square(ctx.grad(p).astype(jnp.float32))) for ctx, p in pairs),
                 jnp.float32(0))
        coef = jnp.minimum(1.0, self.max_gradient_norm / (jnp.sqrt(sq) + 1e-6))
        for ctx, p in pairs:
            g = ctx.grad(p)
            ctx.set_grad(p, (g.astype(jnp.float32) * coef).astype(g.dtype))

    @deferrable("GradScaler.update()")
    def update(self, new_scale: Any = None) -> None:
        """Adjusts the dynamic scale after the optimizers of this step were stepped."""
        if new_scale is not None:
            raise ConfigError(
                "GradScaler.update() does not take a new scale in cerebrax (nor in cstorch)."
            )
        ctx = self._context("update()")
        self.update_scale()
        scratch = self._scratch(ctx)
        scratch["unscaled"], scratch["stepped"] = {}, set()

    @deferrable("GradScaler.update_scale()")
    def update_scale(self, optimizers: Any = None) -> None:
        """The dynamic scale rule, on this step's finite flag (what :meth:`update` runs).

        An overflowing step counts against ``overflow_tolerance``: once the fraction of
        overflowing steps since the last change exceeds it, the scale halves; after more
        than ``steps_per_increase`` steps without that, it doubles. The scale is then
        kept in ``[min_loss_scale, max_loss_scale]``. ``optimizers`` is accepted for
        cstorch's signature; the flag covers every optimizer unscaled in this step.
        """
        del optimizers
        ctx = self._context("update_scale()")
        if not (self._active() and self.dynamic):
            return
        finite = self._finite(self._scratch(ctx))
        s = dict(self._state.value)
        steps = s["steps_since_rescale"] + 1
        overflows = s["overflows_since_rescale"] + (~finite).astype(jnp.int32)
        ratio = overflows.astype(jnp.float32) / steps.astype(jnp.float32)
        too_many = ratio > self.overflow_tolerance
        grow = jnp.logical_and(~too_many, steps > self.steps_per_increase)
        scale = jnp.where(too_many, s["loss_scale"] / 2,
                          jnp.where(grow, s["loss_scale"] * 2, s["loss_scale"]))
        reset = jnp.logical_or(too_many, grow)
        capped = jnp.minimum(scale, self.max_loss_scale)
        s["non_clamped_loss_scale"] = capped
        s["loss_scale"] = jnp.maximum(capped, self.min_loss_scale)
        s["steps_since_rescale"] = jnp.where(reset, 0, steps)
        s["overflows_since_rescale"] = jnp.where(reset, 0, overflows)
        self._state.value = s

    # ---- checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The scaler state as Python numbers ({} when scaling is inactive, as cstorch)."""
        if not self._active():
            return {}
        values = jax.device_get(self._state.value)
        return {"loss_scale": float(values["loss_scale"]),
                "steps_since_rescale": int(values["steps_since_rescale"]),
                "overflows_since_rescale": int(values["overflows_since_rescale"]),
                "num_skipped_steps": int(values["num_skipped_steps"])}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the scaler state from :meth:`state_dict`'s dict.

        Keys the scaler does not hold are ignored and missing ones keep their values
        (a missing ``non_clamped_loss_scale`` takes the loaded ``loss_scale``). An empty
        dict (a scaler saved where scaling was inactive) loads nothing, where an enabled
        torch ``GradScaler`` raises.
        """
        if not state_dict:
            return
        current = dict(self._state.stored)
        for key in current:
            if key in state_dict:
                current[key] = jnp.asarray(state_dict[key], current[key].dtype)
        if "non_clamped_loss_scale" not in state_dict:
            current["non_clamped_loss_scale"] = current["loss_scale"]
        self._state.value = current


def _parameters(optimizer: Any) -> list:
    """The compiled parameters of ``optimizer``'s param groups, in order (a torch
    optimizer kept in the step lists the module's torch parameters)."""
    found = (resolve_parameter(p) for group in optimizer.param_groups for p in group["params"])
    return [p for p in found if p is not None]


def _scalers_of(ctx: ActiveContext) -> list[dict]:
    """The per-step records of the grad scalers used in this step."""
    return [v for k, v in ctx.records() if isinstance(k, tuple) and k[0] == "grad_scaler"]


@deferrable_function("cstorch.amp.isfinite()")
def isfinite(optimizer: Any) -> Any:
    """Whether a grad scaler found ``optimizer``'s gradients finite in this step.

    The flag its last ``GradScaler.step`` (or ``step_if_finite``) in this step was
    conditioned on, else what ``unscale_`` found; True (a Python bool) when no grad
    scaler looked at the optimizer's gradients in this step (outside a step, or
    without loss scaling). Inside a step it is a traced bool, which can be returned
    from the step or passed to a step closure.
    """
    ctx = _step.active_context()
    if ctx is None:
        return True
    stepped = ctx.record(("isfinite", id(optimizer)))
    if stepped is not None:
        return stepped  # the flag its scaler step was conditioned on
    flags = [s["unscaled"][id(optimizer)] for s in _scalers_of(ctx)
             if id(optimizer) in s["unscaled"]]
    if not flags:
        return True
    finite = flags[0]
    for flag in flags[1:]:
        finite = jnp.logical_and(finite, flag)
    return finite


def update_if_finite(optimizer: Any, tensor: Any) -> None:
    """Marks ``tensor`` to keep its old value in a step that loss scaling skips.

    In cerebrax every parameter, every optimizer's state and hyperparameters and every
    scheduler counter already keep their values in a skipped step. Other registered
    state (a :class:`cerebrax.Parameter` or state slot, e.g. the accumulator of a
    custom optimizer kept outside ``optimizer.state``) is marked here: writes to it
    after ``GradScaler.step`` in a step with non-finite gradients are dropped. A plain
    array is a value, not state; it needs no mark.
    """
    del optimizer
    if isinstance(tensor, _step.StateRef):
        tensor.skippable = True
