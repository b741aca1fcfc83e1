"""Composition: the closed forms ``sequential`` and ``chained`` and their schedulers.

``sequential`` switches from one schedule to the next at milestones (each restarting
from step 0); ``chained`` multiplies schedules that share the step. The schedulers
``SequentialLR`` and ``ChainedScheduler`` (alias ``ChainedLR``) adopt their member
schedulers: from then on the composite alone steps the counter and writes the learning
rate, and a member's ``step()`` raises. Its closed form is the composition
(:func:`sequential`, :func:`chained`) of the members' closed forms, each evaluated at
the member's own step.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from ..errors import ConfigError
from . import _checks as checks
from . import _float32 as fp
from ._base import LRScheduler, Schedule
from ._schedulers import _ClosedFormScheduler

__all__ = ["ChainedLR", "ChainedScheduler", "SequentialLR", "chained", "sequential"]


def sequential(schedules: Sequence[Schedule], milestones: Sequence[int]) -> Schedule:
    """``schedules[k](t - milestones[k - 1])`` with ``k = #{m in milestones : m <= t}``
    (torch's and cstorch's ``SequentialLR``: each schedule restarts from step 0).

    Example:
      >>> warmup_then_decay = sequential([linear(0.0, 1.0, 10), cosine_decay(1.0, 0.0, 90)], [10])
      >>> warmup_then_decay(jnp.array([5, 10, 100]))
      Array([0.5, 1. , 0. ], dtype=float32)
    """
    schedules = list(schedules)
    milestones = checks.step_list("milestones", milestones, non_decreasing=True)
    if not schedules or len(milestones) != len(schedules) - 1:
        raise ConfigError(
            f"SequentialLR needs one milestone fewer than schedulers (the step each "
            f"scheduler after the first starts at); got {len(schedules)} schedulers and "
            f"milestones={milestones}"
        )

    def schedule(step: ArrayLike) -> jax.Array:
        t = fp.count(step)
        lr = schedules[0](t)
        for start, later in zip(milestones, schedules[1:]):
            lr = jnp.where(t >= start, later(jnp.maximum(t - start, 0)), lr)
        return lr

    return schedule


def chained(schedules: Sequence[Schedule], *,
            initial_learning_rates: Sequence[float] | None = None) -> Schedule:
    """``schedules[0](t) * prod_{i >= 1} schedules[i](t) / initial_learning_rates[i - 1]``
    (cstorch's ``ChainedScheduler``: later schedules act as factors relative to their
    initial learning rate; by default their value at step 0).

    Example:
      >>> chained([constant(0.1), step_decay(1.0, 10, 0.5)])(10)
      Array(0.05, dtype=float32)
    """
    schedules = list(schedules)
    if not schedules:
        raise ConfigError("ChainedScheduler needs at least one scheduler, got none")
    later = schedules[1:]
    if initial_learning_rates is None:
        # Host sync point: evaluates the later schedules once, eagerly.
        initial_learning_rates = [float(s(0)) for s in later]
    divisors = [checks.number(f"initial_learning_rates[{i}]", v)
                for i, v in enumerate(initial_learning_rates)]
    if len(divisors) != len(later) or 0.0 in divisors:
        raise ConfigError(
            f"initial_learning_rates must hold one nonzero rate per schedule after the "
            f"first ({len(later)}), got {list(initial_learning_rates)!r}"
        )

    def schedule(step: ArrayLike) -> jax.Array:
        lr = schedules[0](step)
        for factor, divisor in zip(later, divisors):
            lr = lr * (factor(step) / divisor)
        return lr

    return schedule


def _members(owner: str, schedulers: Any, optimizer: Any = None) -> list[LRScheduler]:
    if isinstance(schedulers, LRScheduler) or not isinstance(schedulers, Sequence):
        raise ConfigError(f"{owner} needs a list of schedulers, got {schedulers!r}")
    members = list(schedulers)
    if not members:
        raise ConfigError(f"{owner} needs at least one scheduler, got an empty list")
    optimizer = members[0].optimizer if optimizer is None else optimizer
    for i, member in enumerate(members):
        if not isinstance(member, LRScheduler):
            raise ConfigError(
                f"{owner} schedulers[{i}] must be a cerebrax LRScheduler, got "
                f"{type(member).__name__}"
            )
        if member.optimizer is not optimizer:
            raise ConfigError(
                f"{owner} expects all schedulers to belong to the same optimizer, but "
                f"schedulers[{i}] ({type(member).__name__}) schedules a different one"
            )
        if member._owner is not None or any(m is member for m in members[:i]):
            raise ConfigError(
                f"{owner} schedulers[{i}] ({type(member).__name__}) already belongs to a "
                "composite scheduler; create a new scheduler for each place it is used"
            )
    return members


class SequentialLR(_ClosedFormScheduler):
    """Runs ``schedulers`` one after the other: from step ``milestones[k - 1]`` on,
    ``schedulers[k]`` runs from its own step 0 (``lr = f_k(t - milestones[k - 1])``).

    Matches torch's and cstorch's ``SequentialLR``. The members are adopted: step,
    save and restore the ``SequentialLR`` only.

    Example:
      >>> warmup = cstorch.optim.lr_scheduler.LinearLR(optimizer, 0.0, 0.1, total_iters=100)
      >>> decay = cstorch.optim.lr_scheduler.CosineDecayLR(optimizer, 0.1, 0.0, total_iters=900)
      >>> scheduler = cstorch.optim.lr_scheduler.SequentialLR(
      ...     optimizer, [warmup, decay], milestones=[100])
    """

    def __init__(self, optimizer: Any, schedulers: Sequence[LRScheduler],
                 milestones: Sequence[int], last_epoch: int = -1):
        members = _members("SequentialLR", schedulers, optimizer)
        self._schedulers = members
        self._milestones = checks.step_list("milestones", milestones, non_decreasing=True)
        self._schedule = sequential([m._lr_at for m in members], self._milestones)
        super().__init__(optimizer, last_epoch=last_epoch)
        members[0]._adopt("SequentialLR", lambda: self.last_epoch)
        for start, member in zip(self._milestones, members[1:]):
            member._adopt("SequentialLR", lambda start=start: self._member_step(start))

    def _member_step(self, start: int) -> jax.Array:
        return jnp.maximum(self.last_epoch - start, 0)

    def _reference_lr(self) -> float | None:
        return self._schedulers[0]._reference_lr()

    def state_dict(self) -> dict[str, Any]:
        """``last_epoch``, ``_last_lr``, ``_milestones`` and, for reference, each
        member's state at its own step (derived: loading restores ``last_epoch``)."""
        return {**super().state_dict(), "_milestones": list(self._milestones),
                "_schedulers": [m.state_dict() for m in self._schedulers]}


class ChainedScheduler(_ClosedFormScheduler):
    """Multiplies schedulers that share the step:
    ``lr = f_0(t) * prod_{i >= 1} f_i(t) / initial_i``, where ``initial_i`` is the
    initial learning rate of ``schedulers[i]`` (``learning_rate`` for ``ConstantLR``,
    ``learning_rates[0]`` for ``PiecewiseConstantLR``, ``base_lr`` for ``CyclicLR``).

    This is cstorch's ``ChainedScheduler``; with ``schedulers[i]`` built on an initial
    rate of 1 it is torch's ``ChainedScheduler`` of multiplicative schedulers. The
    members are adopted: step, save and restore the ``ChainedScheduler`` only.

    Example:
      >>> base = cstorch.optim.lr_scheduler.PiecewiseConstantLR(optimizer, [0.01, 0.1], [5])
      >>> decay = cstorch.optim.lr_scheduler.ExponentialLR(optimizer, 1.0, 1, 0.99)
      >>> scheduler = cstorch.optim.lr_scheduler.ChainedScheduler([base, decay])
    """

    def __init__(self, schedulers: Sequence[LRScheduler]):
        members = _members("ChainedScheduler", schedulers)
        divisors = []
        for i, member in enumerate(members[1:], 1):
            reference = member._reference_lr()
            if not isinstance(reference, numbers.Real) or reference == 0:
                raise ConfigError(
                    f"ChainedScheduler divides schedulers[{i}] ({type(member).__name__}) by "
                    f"its initial learning rate, which is {reference!r}. Give it a nonzero "
                    "initial learning rate (1.0 makes it a plain factor)."
                )
            divisors.append(float(reference))
        self._schedulers = members
        self._schedule = chained([m._lr_at for m in members], initial_learning_rates=divisors)
        super().__init__(members[0].optimizer)
        for member in members:
            member._adopt("ChainedScheduler", lambda: self.last_epoch)

    def _reference_lr(self) -> float | None:
        return self._schedulers[0]._reference_lr()

    def state_dict(self) -> dict[str, Any]:
        """``last_epoch``, ``_last_lr`` and, for reference, each member's state."""
        return {**super().state_dict(),
                "_schedulers": [m.state_dict() for m in self._schedulers]}


ChainedLR = ChainedScheduler
