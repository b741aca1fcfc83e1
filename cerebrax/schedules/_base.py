"""``LRScheduler``: a step counter in registered state and a closed-form schedule.

A scheduler's constructor takes its first step (``last_epoch`` -1 -> 0) and writes
``lr = f(0)`` into every param group of its optimizer; each ``step()`` increments the
counter and writes ``f(counter)``. Inside a traced step the counter and the learning
rate are tensors, so the schedule is part of the one compiled graph and a step skipped
by dynamic loss scaling does not advance it.

A composite scheduler (``SequentialLR``, ``ChainedScheduler``, ``ScalePerParamLR``)
adopts the schedulers it is built from: it owns the counter and writes the learning
rate, and evaluates each member's closed form at the member's own step
(:meth:`LRScheduler._lr_at`).

The same machinery schedules other hyperparameters: a scheduler writes the param-group
key :attr:`LRScheduler.param_group_key` (``"lr"`` here, ``"weight_decay"`` for the
weight-decay schedulers). With ``param_group_tags`` it writes only the param groups
whose ``"tags"`` hold one of those tags (a group without a ``"tags"`` key carries the
tag ``None``), as cstorch does.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from .._step import StateRef, deferrable, live_optimizers
from ..errors import ConfigError
from ._signature import resolve_on_inspection

if TYPE_CHECKING:
    from ..optim import Optimizer as ScheduledOptimizer

__all__ = ["LRScheduler", "ParamGroupTags", "Schedule"]

# ``param_group_tags``: a tag, or a list (or set) of tags; ``None`` in one means the
# untagged groups.
ParamGroupTags = str | list[str | None] | set[str | None] | None


def _annotation_names() -> dict[str, Any]:
    """What ``ScheduledOptimizer``, the annotation of a scheduler's ``optimizer``, is in
    ``inspect.signature``: cstorch's annotation, ``torch.optim.Optimizer``, where torch is
    installed (Model Zoo's config builder keys on that class), else ``Any``.

    Called when a scheduler's signature is first inspected, so importing cerebrax never
    imports torch. A type checker sees the cerebrax optimizer a scheduler takes.
    """
    try:
        import torch.optim
    except ImportError:
        return {"ScheduledOptimizer": Any}
    return {"ScheduledOptimizer": torch.optim.Optimizer}


@runtime_checkable  # isinstance(f, Schedule): f is callable (pydantic checks so)
class Schedule(Protocol):
    """A closed-form schedule: ``schedule(step)`` is the value (e.g. the learning rate)
    at an integer ``step`` (a Python int, or an int32 array, traced or not), a float32
    array of the step's shape.

    The functions of :mod:`cerebrax.schedules` (:func:`~cerebrax.schedules.linear`,
    :func:`~cerebrax.schedules.cosine_decay`, ...) return one; any function of that
    signature is one.
    """

    def __call__(self, step: ArrayLike, /) -> jax.Array:
        """The value at ``step``."""


MSG_ADOPTED = """\
{name} is part of a {owner}, which owns the step counter and writes the param groups.
Call {owner_var}.step() (and state_dict / load_state_dict) on the {owner} only:
    scheduler = {owner}(optimizer, ...)
    ...
    scheduler.step()"""

MSG_NO_TAGGED_GROUP = """\
{name} was created with param_group_tags={tags!r}, but no param group of the optimizer
carries one of them (the groups' tags: {available}). A param group gets tags from a
"tags" key in its dict; a group without one counts as tagged None:
    optimizer = cstorch.optim.AdamW([{{"params": embeddings, "tags": {{"embedding"}}}},
                                     {{"params": others}}], lr=1e-3)
    scheduler = {name}(optimizer, ..., param_group_tags="embedding")   # the first group
    scheduler = {name}(optimizer, ..., param_group_tags=[None])        # the others"""


def normalize_tags(tags: ParamGroupTags, where: str) -> frozenset | None:
    """``param_group_tags`` as a set of tags, or None for every group."""
    if tags is None:
        return None
    items = list(tags) if isinstance(tags, (list, tuple, set, frozenset)) else [tags]
    for tag in items:
        if tag is not None and not isinstance(tag, str):
            raise ConfigError(
                f"{where}: param_group_tags must be a tag (a str), or a list of tags and "
                f"None, got {tag!r} in {tags!r}"
            )
    out = frozenset(items)
    if len(out) != len(items):
        raise ConfigError(f"{where}: param_group_tags contains duplicate values: {tags!r}")
    return out


def group_tags(group: Any) -> set:
    """A param group's tags: its ``"tags"`` (a tag or a collection), ``{None}`` without."""
    tags = group.get("tags", {None})
    if tags is None:
        return set()
    return {tags} if isinstance(tags, str) else set(tags)


def tagged_groups(optimizer: Any, tags: frozenset | None, name: str) -> list[int]:
    """Indices of the param groups that ``tags`` select (every group for None)."""
    groups = optimizer.param_groups
    selected = [i for i, g in enumerate(groups) if tags is None or tags & group_tags(g)]
    if not selected:
        available = set().union(*(group_tags(g) for g in groups))
        raise ConfigError(MSG_NO_TAGGED_GROUP.format(
            name=name, tags=sorted(tags, key=str), available=sorted(available, key=str)))
    return selected


class LRScheduler(abc.ABC):
    """Base class of learning-rate schedulers (cstorch's ``LRScheduler``).

    Subclasses implement :meth:`_get_closed_form_lr`, a function of
    ``self.last_epoch`` written with ``jnp`` ops only (no Python branches on it).

    Args:
      optimizer: a cerebrax optimizer.
      total_iters: the length of the schedule, where it has one.
      last_epoch: the step the schedule resumes after (-1 starts at step 0).
      param_group_tags: write only the param groups carrying one of these tags (see
        the module docstring); None writes every group.
    """

    param_group_key = "lr"  # the param-group entry the schedule writes
    _last_value_key = "_last_lr"  # its name in state_dict()
    _step_override: jax.Array | None = None
    _owner: tuple[str, Callable[[], jax.Array]] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:
            cls.step = deferrable(f"{cls.__name__}.step()")(cls.__dict__["step"])
        resolve_on_inspection(cls, _annotation_names)

    def __init__(self, optimizer: ScheduledOptimizer, total_iters: int | None = None,
                 last_epoch: int = -1, param_group_tags: ParamGroupTags = None):
        name = type(self).__name__
        if not any(optimizer is opt for opt in live_optimizers()):
            raise ConfigError(
                f"{name} needs a cerebrax optimizer (cstorch.optim.*), got "
                f"{type(optimizer).__name__}. torch.optim optimizers cannot be scheduled."
            )
        self.optimizer = optimizer
        self.total_iters = total_iters
        self.param_group_tags = normalize_tags(param_group_tags, name)
        self._groups = tagged_groups(optimizer, self.param_group_tags, name)
        missing = [i for i in self._groups
                   if self.param_group_key not in optimizer.param_groups[i]]
        if missing:
            raise ConfigError(
                f"{name} writes {self.param_group_key!r}, which param group {missing[0]} of "
                f"{type(optimizer).__name__} does not have"
            )
        self._counter = StateRef(
            np.int32(last_epoch), name=f"{type(self).__name__}.last_epoch", skippable=True
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

    def _group_value(self, value: jax.Array, index: int) -> jax.Array:
        """The value written to param group ``index`` (ScalePerParam scales it)."""
        return value

    def _write_lr(self) -> None:
        step = self.last_epoch
        if isinstance(step, jax.core.Tracer):
            value = jnp.asarray(self._get_closed_form_lr(), jnp.float32)
        else:
            # Outside a step (construction, load_state_dict) the closed form runs as one
            # program: eagerly, each of its operations would compile a program of its own.
            value = jax.jit(lambda t: jnp.asarray(self._lr_at(t), jnp.float32))(step)
        groups = self.optimizer.param_groups
        for i in self._groups:
            groups[i][self.param_group_key] = self._group_value(value, i)

    def get_last_value(self) -> list[float | None]:
        """The value of every param group as written by the last step; None for the
        groups the scheduler does not write (``param_group_tags``)."""
        key, groups = self.param_group_key, self.optimizer.param_groups
        return [groups[i][key] if i in self._groups else None for i in range(len(groups))]

    def get_last_lr(self) -> list[float | None]:
        """The learning rate of every param group (as written by the last step)."""
        return self.get_last_value()

    def get_lr(self) -> list[float | None]:
        """The same as :meth:`get_last_lr`: the learning rates the last step wrote.
        Unlike torch's ``get_lr``, it computes nothing and does not warn outside
        ``step()``."""
        return self.get_last_value()

    @deferrable("LRScheduler.step()")
    def step(self, epoch: Any = None) -> None:
        """Advances the schedule one step and writes the new learning rate."""
        self._check_not_adopted("step()")
        if epoch is not None:
            raise ConfigError(
                f"{type(self).__name__}.step(epoch) is not supported: the learning rate is a "
                "closed-form function of the global step; call step() once per step."
            )
        count = self._counter.value
        if isinstance(count, jax.core.Tracer) or not count.is_fully_addressable:
            self._counter.value = optax.safe_increment(count)
        else:  # on the host, as optax.safe_increment: saturates at the largest int32
            self._counter.value = np.int32(min(int(count) + 1, np.iinfo(np.int32).max))
        self._write_lr()

    def state_dict(self) -> dict[str, Any]:
        """The scheduler state: ``last_epoch`` and the last learning rates."""
        # Host sync point: waits for the step that last wrote the counter.
        return {"last_epoch": int(jax.device_get(self.last_epoch)),
                self._last_value_key: self.get_last_value()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores ``last_epoch`` and writes the learning rate of that step."""
        self._check_not_adopted("load_state_dict()")
        self._counter.value = np.int32(state_dict["last_epoch"])
        self._write_lr()


resolve_on_inspection(LRScheduler, _annotation_names)  # its subclasses: __init_subclass__
