"""``LRScheduler``: a step counter in registered state and a closed-form schedule.

A scheduler's constructor takes its first step (``last_epoch`` -1 -> 0) and writes
``lr = f(0)`` into every param group of its optimizer; each ``step()`` increments the
counter and writes ``f(counter)``. Inside a traced step the counter and the learning
rate are tensors, so the schedule is part of the one compiled graph and a step skipped
by dynamic loss scaling does not advance it.
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp
import optax

from .. import _state
from ..errors import ConfigError
from ..trace import deferrable

__all__ = ["LRScheduler"]


class LRScheduler(abc.ABC):
    """Base class of learning-rate schedulers (cstorch's ``LRScheduler``).

    Subclasses implement :meth:`_get_closed_form_lr`, a function of
    ``self.last_epoch`` written with ``jnp`` ops only (no Python branches on it).

    Args:
      optimizer: a cerebrax optimizer.
      total_iters: the length of the schedule, where it has one.
      last_epoch: the step the schedule resumes after (-1 starts at step 0).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:
            cls.step = deferrable(f"{cls.__name__}.step()")(cls.__dict__["step"])

    def __init__(self, optimizer: Any, total_iters: int | None = None, last_epoch: int = -1):
        from ..optim._base import Optimizer

        if not isinstance(optimizer, Optimizer):
            raise ConfigError(
                f"{type(self).__name__} needs a cerebrax optimizer (cstorch.optim.*), got "
                f"{type(optimizer).__name__}. torch.optim optimizers cannot be scheduled."
            )
        self.optimizer = optimizer
        self.total_iters = total_iters
        self._counter = _state.StateRef(
            jnp.int32(last_epoch), name=f"{type(self).__name__}.last_epoch", skippable=True
        )
        self.step()

    @property
    def last_epoch(self) -> jax.Array:
        """The step counter (an int32 array; traced inside a step)."""
        return self._counter.value

    @abc.abstractmethod
    def _get_closed_form_lr(self) -> jax.Array:
        """The learning rate at ``self.last_epoch``."""

    def get_last_lr(self) -> list[float]:
        """The learning rate of every param group (as written by the last step)."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_lr(self) -> list[float]:
        return self.get_last_lr()

    @deferrable("LRScheduler.step()")
    def step(self, epoch: Any = None) -> None:
        """Advances the schedule one step and writes the new learning rate."""
        if epoch is not None:
            raise ConfigError(
                f"{type(self).__name__}.step(epoch) is not supported: the learning rate is a "
                "closed-form function of the global step; call step() once per step."
            )
        self._counter.value = optax.safe_increment(self._counter.value)
        lr = jnp.asarray(self._get_closed_form_lr(), jnp.float32)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        """The scheduler state: ``last_epoch`` and the last learning rates."""
        return {"last_epoch": int(jax.device_get(self._counter.value)),
                "_last_lr": self.get_last_lr()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._counter.value = jnp.int32(state_dict["last_epoch"])
        lr = jnp.asarray(self._get_closed_form_lr(), jnp.float32)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
