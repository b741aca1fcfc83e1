"""``LRScheduler``: a step counter in registered state and a closed-form schedule.

A scheduler's constructor takes its first step (``last_epoch`` -1 -> 0) and writes
``lr = f(0)`` into every param group of its optimizer; each ``step()`` increments the
counter and writes ``f(counter)``. Inside a traced step the counter and the learning
rate are tensors, so the schedule is part of the one compiled graph and a step skipped
by dynamic loss scaling does not advance it.

A composite scheduler (``SequentialLR``, ``ChainedScheduler``) adopts the schedulers
it is built from: it owns the counter and writes the learning rate, and evaluates
each member's closed form at the member's own step (:meth:`LRScheduler._lr_at`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from .. import _state
from ..errors import ConfigError
from .._trace_context import deferrable

__all__ = ["LRScheduler", "Schedule"]

# A closed form: ``schedule(step) -> lr``, for an integer step (a Python int, or an int32
# array, traced or not) a float32 array of the step's shape.
Schedule = Callable[[ArrayLike], jax.Array]

MSG_ADOPTED = """\
{name} is part of a {owner}, which owns the step counter and writes the learning rate.
Call {owner_var}.step() (and state_dict / load_state_dict) on the {owner} only:
    scheduler = cstorch.optim.lr_scheduler.{owner}(...)
    ...
    scheduler.step()"""


class LRScheduler(abc.ABC):
    """Base class of learning-rate schedulers (cstorch's ``LRScheduler``).

    Subclasses implement :meth:`_get_closed_form_lr`, a function of
    ``self.last_epoch`` written with ``jnp`` ops only (no Python branches on it).

    Args:
      optimizer: a cerebrax optimizer.
      total_iters: the length of the schedule, where it has one.
      last_epoch: the step the schedule resumes after (-1 starts at step 0).
    """

    _step_override: jax.Array | None = None
    _owner: tuple[str, Callable[[], jax.Array]] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:
            cls.step = deferrable(f"{cls.__name__}.step()")(cls.__dict__["step"])

    def __init__(self, optimizer: Any, total_iters: int | None = None, last_epoch: int = -1):
        if not any(optimizer is opt for opt in _state.live_optimizers()):
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
        if self._step_override is not None:
            return self._step_override
        if self._owner is not None:
            return self._owner[1]()
        return self._counter.value

    @abc.abstractmethod
    def _get_closed_form_lr(self) -> jax.Array:
        """The learning rate at ``self.last_epoch``."""

    def _lr_at(self, step: ArrayLike) -> jax.Array:
        """The learning rate at ``step`` (an int32 array), for composite schedulers.

        Evaluates :meth:`_get_closed_form_lr` with ``last_epoch`` reading ``step``.
        """
        saved, self._step_override = self._step_override, jnp.asarray(step, jnp.int32)
        try:
            return jnp.asarray(self._get_closed_form_lr(), jnp.float32)
        finally:
            self._step_override = saved

    def _reference_lr(self) -> float | None:
        """The rate a ``ChainedScheduler`` divides this scheduler's value by."""
        return getattr(self, "initial_learning_rate", None)

    def _adopt(self, owner: str, step_of: Callable[[], jax.Array]) -> None:
        self._owner = (owner, step_of)

    def _check_not_adopted(self, what: str) -> None:
        if self._owner is not None:
            raise ConfigError(
                f"{type(self).__name__}.{what} was called, but "
                + MSG_ADOPTED.format(name=type(self).__name__, owner=self._owner[0],
                                     owner_var="scheduler")
            )

    def _write_lr(self) -> None:
        lr = jnp.asarray(self._get_closed_form_lr(), jnp.float32)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def get_last_lr(self) -> list[float]:
        """The learning rate of every param group (as written by the last step)."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_lr(self) -> list[float]:
        return self.get_last_lr()

    @deferrable("LRScheduler.step()")
    def step(self, epoch: Any = None) -> None:
        """Advances the schedule one step and writes the new learning rate."""
        self._check_not_adopted("step()")
        if epoch is not None:
            raise ConfigError(
                f"{type(self).__name__}.step(epoch) is not supported: the learning rate is a "
                "closed-form function of the global step; call step() once per step."
            )
        self._counter.value = optax.safe_increment(self._counter.value)
        self._write_lr()

    def state_dict(self) -> dict[str, Any]:
        """The scheduler state: ``last_epoch`` and the last learning rates."""
        # Host sync point: waits for the step that last wrote the counter.
        return {"last_epoch": int(jax.device_get(self.last_epoch)),
                "_last_lr": self.get_last_lr()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores ``last_epoch`` and writes the learning rate of that step."""
        self._check_not_adopted("load_state_dict()")
        self._counter.value = jnp.int32(state_dict["last_epoch"])
        self._write_lr()
