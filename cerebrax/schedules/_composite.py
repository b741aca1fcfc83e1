"""Composition: the closed forms ``sequential`` and ``chained`` and their schedulers.

``sequential`` switches from one schedule to the next at milestones (each restarting
from step 0); ``chained`` multiplies schedules that share the step. The schedulers
``SequentialLR``, ``ChainedScheduler`` (alias ``ChainedLR``) and ``ScalePerParamLR``
adopt their member schedulers: from then on the composite alone steps the counter and
writes the learning rate, and a member's ``step()`` raises. Its closed form is the
composition (:func:`sequential`, :func:`chained`) of the members' closed forms, each
evaluated at the member's own step. Members write the same param-group key and carry
the same ``param_group_tags`` as their composite, as cstorch requires.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from ..errors import ConfigError
from . import _checks as checks
from . import _float32 as fp
from ._base import LRScheduler, ParamGroupTags, Schedule, normalize_tags
from ._schedulers import _ClosedFormScheduler

if TYPE_CHECKING:
    from ._base import ScheduledOptimizer

__all__ = ["ChainedLR", "ChainedScheduler", "ScalePerParamLR", "SequentialLR", "chained",
           "sequential"]


def sequential(schedules: Sequence[Schedule], milestones: Sequence[int]) -> Schedule:
    """``schedules[k](t - milestones[k - 1])`` with ``k = #{m in milestones : m <= t}``
    (torch's and cstorch's ``SequentialLR``: each schedule restarts from step 0).

    Example:
      >>> from cerebrax.schedules import cosine_decay, linear, sequential
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
      >>> from cerebrax.schedules import chained, constant, step_decay
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


def _members(owner: type, schedulers: Any, param_group_tags: ParamGroupTags,
             optimizer: Any = None) -> list[LRScheduler]:
    """The member schedulers of a composite of class ``owner``, checked."""
    name = owner.__name__
    if isinstance(schedulers, LRScheduler) or not isinstance(schedulers, Sequence):
        raise ConfigError(f"{name} needs a list of schedulers, got {schedulers!r}")
    members = list(schedulers)
    if not members:
        raise ConfigError(f"{name} needs at least one scheduler, got an empty list")
    optimizer = members[0].optimizer if optimizer is None else optimizer
    tags = normalize_tags(param_group_tags, name)
    for i, member in enumerate(members):
        _check_member(owner, f"schedulers[{i}]", member, optimizer, tags)
        if any(m is member for m in members[:i]):
            raise ConfigError(
                f"{name} schedulers[{i}] ({type(member).__name__}) already belongs to a "
                "composite scheduler; create a new scheduler for each place it is used"
            )
    return members


def _check_member(owner: type, where: str, member: Any, optimizer: Any,
                  tags: frozenset | None) -> None:
    name, kind = owner.__name__, type(member).__name__
    if not isinstance(member, LRScheduler):
        raise ConfigError(f"{name} {where} must be a cerebrax scheduler, got {kind}")
    if member.optimizer is not optimizer:
        raise ConfigError(
            f"{name} expects all schedulers to belong to the same optimizer, but "
            f"{where} ({kind}) schedules a different one"
        )
    if member._owner is not None:
        raise ConfigError(
            f"{name} {where} ({kind}) already belongs to a composite scheduler; create a "
            "new scheduler for each place it is used"
        )
    if isinstance(member, ScalePerParamLR):
        raise ConfigError(
            f"{name} {where} is a {kind}, which scales the values it writes per param "
            f"group; wrap the {name} in it instead: {kind}(optimizer, {name}(...))"
        )
    if member.param_group_key != owner.param_group_key:
        raise ConfigError(
            f"{name} writes {owner.param_group_key!r} but {where} ({kind}) writes "
            f"{member.param_group_key!r}; combine schedulers of the same kind"
        )
    if member.param_group_tags != tags:
        raise ConfigError(
            f"{name} expects {where} ({kind}) to have the same param_group_tags, "
            f"{_shown(tags)}, but it has {_shown(member.param_group_tags)}; give them all "
            "the same param_group_tags"
        )


def _shown(tags: frozenset | None) -> Any:
    return None if tags is None else sorted(tags, key=str)


class SequentialLR(_ClosedFormScheduler):
    """Runs ``schedulers`` one after the other: from step ``milestones[k - 1]`` on,
    ``schedulers[k]`` runs from its own step 0 (``lr = f_k(t - milestones[k - 1])``).

    Matches torch's and cstorch's ``SequentialLR``. The members are adopted: step,
    save and restore the ``SequentialLR`` only.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.SGD(compiled.parameters(), lr=0.1)
      >>> warmup = cstorch.optim.lr_scheduler.LinearLR(optimizer, 0.0, 0.1, total_iters=2)
      >>> decay = cstorch.optim.lr_scheduler.CosineDecayLR(optimizer, 0.1, 0.0, total_iters=4)
      >>> scheduler = cstorch.optim.lr_scheduler.SequentialLR(
      ...     optimizer, [warmup, decay], milestones=[2])
      >>> lrs = []
      >>> for _ in range(7):
      ...     lrs.append(round(scheduler.get_last_lr()[0], 5))
      ...     scheduler.step()
      >>> lrs
      [0.0, 0.05, 0.1, 0.08536, 0.05, 0.01464, 0.0]
    """

    def __init__(self, optimizer: ScheduledOptimizer, schedulers: list[LRScheduler],
                 milestones: Sequence[int], last_epoch: int = -1,
                 param_group_tags: ParamGroupTags = None):
        members = _members(type(self), schedulers, param_group_tags, optimizer)
        self._schedulers = members
        self._milestones = checks.step_list("milestones", milestones, non_decreasing=True)
        self._schedule = sequential([m._lr_at for m in members], self._milestones)
        super().__init__(optimizer, last_epoch=last_epoch, param_group_tags=param_group_tags)
        owner = type(self).__name__
        members[0]._adopt(owner, lambda: self.last_epoch)
        for start, member in zip(self._milestones, members[1:]):
            member._adopt(owner, lambda start=start: self._member_step(start))

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
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.SGD(compiled.parameters(), lr=0.1)
      >>> base = cstorch.optim.lr_scheduler.PiecewiseConstantLR(optimizer, [0.1, 0.01], [2])
      >>> decay = cstorch.optim.lr_scheduler.ExponentialLR(optimizer, 1.0, 1, 0.5)
      >>> scheduler = cstorch.optim.lr_scheduler.ChainedScheduler([base, decay])
      >>> lrs = []
      >>> for _ in range(4):
      ...     lrs.append(round(scheduler.get_last_lr()[0], 5))
      ...     scheduler.step()
      >>> lrs
      [0.1, 0.05, 0.0025, 0.00125]
    """

    def __init__(self, schedulers: list[LRScheduler],
                 param_group_tags: ParamGroupTags = None):
        members = _members(type(self), schedulers, param_group_tags)
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
        super().__init__(members[0].optimizer, param_group_tags=param_group_tags)
        for member in members:
            member._adopt(type(self).__name__, lambda: self.last_epoch)

    def _reference_lr(self) -> float | None:
        return self._schedulers[0]._reference_lr()

    def state_dict(self) -> dict[str, Any]:
        """``last_epoch``, ``_last_lr`` and, for reference, each member's state."""
        return {**super().state_dict(),
                "_schedulers": [m.state_dict() for m in self._schedulers]}


ChainedLR = ChainedScheduler


class ScalePerParamLR(_ClosedFormScheduler):
    """Scales ``scheduler``'s value per param group (cstorch's ``ScalePerParamLR``).

    Param group ``i`` gets ``f(t) * scale_i``, where ``f`` is the wrapped scheduler's
    closed form and ``scale_i`` is the group's ``"adjust_learning_rate"`` entry, else
    its ``"adjust_val"``, else 1, read when the wrapper is built (the per-layer factors
    of muP, or any layer-wise rate). The wrapped scheduler is adopted: step, save and
    restore the wrapper only. It must have the wrapper's ``param_group_tags``.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> params = dict(compiled.named_parameters())
      >>> optimizer = cstorch.optim.AdamW([
      ...     {"params": [params["weight"]], "adjust_learning_rate": 0.25},
      ...     {"params": [params["bias"]]}])
      >>> scheduler = cstorch.optim.lr_scheduler.ScalePerParamLR(
      ...     optimizer, cstorch.optim.lr_scheduler.CosineDecayLR(optimizer, 1e-3, 0.0, 1000))
      >>> [round(group["lr"], 5) for group in optimizer.param_groups]
      [0.00025, 0.001]
    """

    def __init__(self, optimizer: ScheduledOptimizer, scheduler: LRScheduler,
                 param_group_tags: ParamGroupTags = None):
        tags = normalize_tags(param_group_tags, type(self).__name__)
        _check_member(type(self), "scheduler", scheduler, optimizer, tags)
        # Host sync point: the factors are read once, as Python numbers.
        self.adjustment_scalars = [
            float(g.get("adjust_learning_rate", g.get("adjust_val", 1.0)))
            for g in optimizer.param_groups
        ]
        self._scheduler = scheduler
        self._schedule = scheduler._lr_at
        super().__init__(optimizer, total_iters=scheduler.total_iters,
                         param_group_tags=param_group_tags)
        scheduler._adopt(type(self).__name__, lambda: self.last_epoch)

    def _group_value(self, value: jax.Array, index: int) -> jax.Array:
        return value * self.adjustment_scalars[index]

    def _reference_lr(self) -> float | None:
        return self._scheduler._reference_lr()

    def state_dict(self) -> dict[str, Any]:
        """``last_epoch``, the last values and, for reference, the wrapped scheduler's."""
        return {**super().state_dict(), "_scheduler": self._scheduler.state_dict()}
