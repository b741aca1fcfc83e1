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

from .. import _state
from ..errors import ConfigError, StateError
from .._filters import is_torch_tensor
from .._interop import as_jax
from .._trace_context import backward, deferrable
from ..backend import current_backend

__all__ = ["GradScaler", "ScaledLoss"]

_MIN_LOSS_SCALE = 2.0**-14


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
      init_scale: the first dynamic scale (default 2**15, capped by ``max_loss_scale``).
      steps_per_increase: finite steps after which the dynamic scale doubles (2000).
      min_loss_scale: lower bound of the dynamic scale (default and minimum 2**-14).
      max_loss_scale: upper bound of the dynamic scale (default 2**15).
      overflow_tolerance: the fraction of overflowing steps tolerated before halving.
      max_gradient_norm: deprecated; use ``amp.optimizer_step(max_gradient_norm=...)``.

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
                "GradScaler(max_gradient_norm=...) is deprecated and ignored; pass "
                "max_gradient_norm to cstorch.amp.optimizer_step instead.",
                DeprecationWarning, stacklevel=2,
            )
        self.dynamic = loss_scale == "dynamic"
        if isinstance(loss_scale, str) and not self.dynamic:
            raise ConfigError(
                f"GradScaler(loss_scale=...) must be 'dynamic' or a number, got {loss_scale!r}"
            )
        self.steps_per_increase = int(steps_per_increase or 2000)
        self.min_loss_scale = float(min_loss_scale or _MIN_LOSS_SCALE)
        self.max_loss_scale = float(max_loss_scale or 2.0**15)
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
            scale = min(self.max_loss_scale, float(init_scale or 2.0**15))
        else:
            scale = float(loss_scale or 1.0)
            if scale <= 0:
                raise ConfigError(f"a static loss_scale must be > 0, got {loss_scale!r}")
        self._state = _state.StateRef(
            {
                "loss_scale": jnp.float32(scale),
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

    def _scratch(self, ctx: Any) -> dict:
        return ctx.scratch.setdefault(
            ("grad_scaler", id(self)), {"unscaled": {}, "stepped": set(), "updated": False}
        )

    @staticmethod
    def _context(what: str) -> Any:
        ctx = _state.active_context()
        if ctx is None:
            raise StateError(f"GradScaler.{what} must be called inside a @cstorch.trace step.")
        return ctx

    def get_scale(self) -> jax.Array:
        """The current loss scale (a traced value inside a step)."""
        return self._state.value["loss_scale"]

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
        grads = optimizer._require_grads("GradScaler.unscale_()").grads
        params = [p for p in optimizer._all_params if grads.get(p) is not None]
        if not self._active():
            scratch["unscaled"][id(optimizer)] = jnp.bool_(True)
            return
        inv = 1.0 / self.get_scale()
        for p in params:
            grads[p] = (grads[p].astype(jnp.float32) * inv).astype(grads[p].dtype)
        sq = sum((jnp.sum(jnp.square(grads[p].astype(jnp.float32))) for p in params),
                 jnp.float32(0))
        # sqrt(inf) = inf and NaN compares false: both mark the step as overflowed.
        scratch["unscaled"][id(optimizer)] = jnp.sqrt(sq) < jnp.inf

    @deferrable("GradScaler.step()")
    def step(self, optimizer: Any) -> None:
        """Unscales (if not done yet) and steps ``optimizer``; skipped if not finite."""
        ctx = self._context("step()")
        scratch = self._scratch(ctx)
        if id(optimizer) in scratch["stepped"]:
            raise StateError("step() has already been called since the last update().")
        if id(optimizer) not in scratch["unscaled"]:
            self.unscale_(optimizer)
        finite = scratch["unscaled"][id(optimizer)]
        scratch["stepped"].add(id(optimizer))
        if not (self._active() and self.dynamic):
            optimizer.step()
            return
        previous = ctx.condition
        ctx.condition = finite if previous is None else jnp.logical_and(previous, finite)
        optimizer.step()
        # Later skippable writes of this step (scheduler steps) are skipped as well.
        state = dict(self._state.value)
        state["num_skipped_steps"] = state["num_skipped_steps"] + (~finite).astype(jnp.int32)
        self._state.value = state

    @deferrable("GradScaler.update()")
    def update(self, new_scale: Any = None) -> None:
        """Adjusts the dynamic scale after the optimizers of this step were stepped."""
        if new_scale is not None:
            raise ConfigError(
                "GradScaler.update() does not take a new scale in cerebrax (nor in cstorch)."
            )
        ctx = self._context("update()")
        scratch = self._scratch(ctx)
        finite = jnp.bool_(True)
        for flag in scratch["unscaled"].values():
            finite = jnp.logical_and(finite, flag)
        scratch["unscaled"], scratch["stepped"] = {}, set()
        if not (self._active() and self.dynamic):
            return
        s = dict(self._state.value)
        steps = s["steps_since_rescale"] + 1
        overflows = s["overflows_since_rescale"] + (~finite).astype(jnp.int32)
        ratio = overflows.astype(jnp.float32) / steps.astype(jnp.float32)
        too_many = ratio > self.overflow_tolerance
        grow = jnp.logical_and(~too_many, steps > self.steps_per_increase)
        scale = jnp.where(too_many, s["loss_scale"] / 2,
                          jnp.where(grow, s["loss_scale"] * 2, s["loss_scale"]))
        reset = jnp.logical_or(too_many, grow)
        s["loss_scale"] = jnp.clip(scale, self.min_loss_scale, self.max_loss_scale)
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
        if not state_dict:
            return
        current = dict(self._state._value)
        for key in current:
            if key in state_dict:
                current[key] = jnp.asarray(state_dict[key], current[key].dtype)
        self._state.value = current
