"""torch.optim optimizers and schedulers stepped inside a traced step.

A torch loop ported to cerebrax may keep torch's optimizer and scheduler::

    optimizer = torch.optim.AdamW(module.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2, 0.5)

    @cstorch.trace
    def step(x, y):
        optimizer.zero_grad(); loss = ...; loss.backward(); optimizer.step(); scheduler.step()

Run as they are, their Python state (momentum buffers, moments, step counts, the
scheduler's counter) would change once, while the step is traced, and every compiled
step would repeat the first. So a global torch optimizer step pre-hook (installed
before a traced step's program is first built) watches for a torch optimizer stepping
while a step is traced. It refuses an optimizer cerebrax cannot convert
(:func:`~cerebrax.optim._from_torch.check_convertible`), at trace time; otherwise it
abandons the trace (:class:`cerebrax.traced.Retrace`), the optimizer is converted with
:func:`~cerebrax.optim.from_torch` (groups, hyperparameters and state carried), the
torch schedulers bound to it get their closed forms (:mod:`._torch_schedulers`), and
the step is traced again.

From then on the torch objects are facades over the converted ones: each one's class
becomes a subclass of its torch class (``isinstance`` still holds) whose ``step``,
``zero_grad``, ``param_groups``, ``state``, ``state_dict`` and ``load_state_dict`` (a
scheduler's ``step``, ``last_epoch``, ``get_last_lr``, ``state_dict`` and
``load_state_dict``) act on the converted state, in the step and outside it, in torch's
layouts. A scheduler without a closed form refuses to step inside a traced step and
runs as torch runs it outside one, writing the converted optimizer's learning rates.
After ``cstorch.reset()`` (and the module compiled again), the next traced step
converts the facade's last state again.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
import weakref
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import numpy as np

from .. import _step
from .._filters import is_torch_tensor
from .._runtime import RUNTIME
from .._step import as_jax
from .._step import traced
from ..errors import ConfigError, StateError
from ._base import Optimizer
from ._from_torch import check_convertible, from_torch
from ._torch_schedulers import (SchedulerPlan, TorchScheduleLR, bound_schedulers, members,
                                plan, refusal)

__all__ = ["Conversion", "convert", "install_hook"]

MSG_NOT_CONVERTED = """\
{name}.step() was called inside the traced step `{step}`. The compiled step runs the
optimizer's update itself, so cerebrax converts torch optimizers with
cstorch.optim.from_torch, and this one cannot be converted:
{why}"""

MSG_HOOKS = """\
torch.optim.{name} has hooks registered on it ({hooks}); they cannot run in a compiled
step. Remove them, or build a cstorch optimizer and put their work in the step."""

MSG_LATE_SCHEDULER = """\
torch.optim.lr_scheduler.{name} sets the learning rate inside a traced step, but it was
not converted with its optimizer: it was created after the optimizer's first traced
step. In a compiled step the learning rate is a closed form of the step counter, and a
torch scheduler is converted to one when its optimizer is. Create the scheduler before
the first call of the traced step:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 100, 0.5)   # here
    loss = training_step(inputs, targets)"""

MSG_SECOND_SCHEDULER = """\
torch.optim.lr_scheduler.{name} sets the learning rate of a torch optimizer that a
traced step converted, whose rate {other} computes as a closed form of the step; torch
would combine the two schedulers' updates step by step. Build one schedule from both,
before the first call of the traced step:
    scheduler = torch.optim.lr_scheduler.ChainedScheduler([first, second])   # or SequentialLR"""

MSG_LR_WRITE = """\
The learning rate of this torch optimizer's param group {index} was set directly, but
the torch scheduler {other} computes it from the step counter since a traced step
converted them; torch's scheduler would go on from the value set, cerebrax's closed form
does not. Set the rate through the scheduler instead (build it with that rate, or
load_state_dict a state that has it), or drop the scheduler and set the rate yourself."""

MSG_LOAD_OTHER_SETTINGS = """\
The state loaded into torch.optim.lr_scheduler.{name} has other settings ({keys}) than
the scheduler a traced step converted; its closed form is part of the compiled step.
Load the state before the first call of the traced step, or build the scheduler with
these settings."""

_VOLATILE = frozenset({"last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step",
                       "_is_initial", "T_cur", "T_i", "optimizer", "_schedulers",
                       "lr_lambdas", "_cerebrax"})
_WRITER_FRAMES = 8  # how far up a write to a param group looks for a torch scheduler


# ---- the hook ------------------------------------------------------------------------------
def install_hook() -> None:
    """Installs the torch optimizer step pre-hook once torch is imported (cerebrax calls
    it before building a traced step's program)."""
    if RUNTIME.torch_step_hook is not None or "torch" not in sys.modules:
        return
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    RUNTIME.torch_step_hook = register_optimizer_step_pre_hook(_on_torch_step)


traced.before_build(install_hook)


def _on_torch_step(optimizer: Any, args: tuple, kwargs: dict) -> None:
    ctx = _step.active_context()
    if ctx is None:
        return None  # an eager torch step: torch's business
    name = f"torch.optim.{type(optimizer).__name__}"
    try:
        check_convertible(optimizer)
        _check_hooks(optimizer)
    except ConfigError as e:
        step = getattr(getattr(ctx, "step", None), "__name__", "?")
        raise ConfigError(MSG_NOT_CONVERTED.format(name=name, step=step, why=e)) from None
    raise traced.Retrace(functools.partial(convert, optimizer), f"{name}.step() in a step")


def _check_hooks(optimizer: Any) -> None:
    names = [k.removeprefix("_optimizer_") for k, v in vars(optimizer).items()
             if k.startswith("_optimizer_") and k.endswith("_hooks") and v]
    if names:
        raise ConfigError(MSG_HOOKS.format(name=type(optimizer).__name__,
                                           hooks=", ".join(names)))


# ---- the conversion --------------------------------------------------------------------------
def convert(torch_optimizer: Any) -> Conversion:
    """Converts ``torch_optimizer`` and the torch schedulers bound to it, and makes them
    facades over the converted objects (outside a trace; see the module docstring)."""
    plans = _plans(bound_schedulers(torch_optimizer))
    conversion = Conversion(torch_optimizer, from_torch(torch_optimizer))
    links = [(s, _link(conversion, p, kind)) for s, p, kind in plans]
    _become(torch_optimizer, _OptimizerFacade, conversion)
    for scheduler, link in links:
        _become(scheduler, _SCHEDULER_FACADES[link.kind], link)
        conversion.schedulers.append(scheduler)
        if link.kind == "converted":
            conversion.fresh.add(scheduler)
    return conversion


def _plans(schedulers: list) -> list[tuple[Any, SchedulerPlan, str]]:
    """``(scheduler, plan, kind)`` for every scheduler found: kind ``"converted"`` (a
    closed form), ``"refused"`` (none) or ``"member"`` (of a converted composite)."""
    inner = {id(m) for s in schedulers for m in members(s)}
    top = [s for s in schedulers if id(s) not in inner]
    if len(top) > 1:
        names = ", ".join(type(s).__name__ for s in top)
        reason = (f"{len(top)} torch schedulers ({names}) set this optimizer's learning "
                  "rate, and torch combines their updates step by step; combine them in "
                  "one ChainedScheduler or SequentialLR")
        return [(s, SchedulerPlan(s, None, -1, reason), "refused") for s in top]
    out = []
    for scheduler in top:
        p = plan(scheduler)
        out.append((scheduler, p, "refused" if p.schedules is None else "converted"))
        if p.schedules is not None:
            out += [(m, p, "member") for m in members(scheduler)]
    return out


def _link(conversion: Conversion, p: SchedulerPlan, kind: str) -> _Link:
    """A scheduler's link; a ``"converted"`` one gets its cerebrax scheduler."""
    cerebrax = None
    if kind == "converted":
        cerebrax = TorchScheduleLR(conversion.optimizer, p.schedules, p.last_epoch)
    return _Link(conversion, p, kind, cerebrax, owner=p.scheduler)


@functools.cache
def _facade_class(mixin: type, cls: type) -> type:
    return type(cls.__name__, (mixin, cls), {
        "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})


def _become(obj: Any, mixin: type, link: Any) -> None:
    """Makes ``obj`` a facade: its class gets ``mixin`` first, its link is kept."""
    state = vars(obj)
    if mixin is _OptimizerFacade:
        for key in ("step", "state", "param_groups"):  # step: a torch scheduler's wrapper
            state.pop(key, None)
    state["_cerebrax"] = link
    obj.__class__ = _facade_class(mixin, type(obj))


class Conversion:
    """What a converted torch optimizer stands for (its ``__dict__["_cerebrax"]``): the
    cerebrax optimizer, the torch parameters and the keys of each param group that
    cerebrax does not use, and the torch schedulers converted with it."""

    def __init__(self, torch_optimizer: Any, optimizer: Optimizer):
        self.torch_optimizer = torch_optimizer
        self.optimizer = optimizer
        self.params = [list(g["params"]) for g in torch_optimizer.param_groups]
        self.keys = [[k for k in g if k != "params"] for g in torch_optimizer.param_groups]
        self.extras = [{k: v for k, v in g.items() if k != "params" and k not in own}
                       for g, own in zip(torch_optimizer.param_groups, self._own_keys())]
        self.groups = [TorchParamGroup(self, i) for i in range(len(self.params))]
        self.schedulers: list = []
        # Schedulers converted by the last trace's retrace, not yet seen after it; a
        # step that runs one before the optimizer stepped it once in that trace too.
        self.fresh: set = set()
        self._trace: Any = None  # a weak reference to the trace context of _early
        self._early: dict = {}
        self._stepped: Any = None  # ... of the trace in which the optimizer stepped

    def _own_keys(self) -> list[set]:
        return [set(g) for g in self.optimizer.param_groups]

    def current(self) -> Optimizer | None:
        """The converted optimizer, unless ``cstorch.reset()`` made it stale."""
        return self.optimizer if self.optimizer.generation == _step.current_generation() \
            else None

    def ensure_current(self) -> None:
        """Inside a trace: converts again (a :class:`~cerebrax.traced.Retrace`) when stale."""
        if self.current() is None:
            raise traced.Retrace(self.convert_again, "a torch optimizer after cstorch.reset()")

    def convert_again(self) -> None:
        """Converts the stale optimizer's last state (and its schedulers') again."""
        epochs = [(s, int(vars(s)["_cerebrax"].cerebrax.last_epoch))
                  for s in self.schedulers if vars(s)["_cerebrax"].cerebrax is not None]
        self.optimizer = from_torch(self.torch_optimizer)
        for scheduler, epoch in epochs:
            link = vars(scheduler)["_cerebrax"]
            link.cerebrax = TorchScheduleLR(self.optimizer, link.plan.schedules, epoch)

    def before_optimizer_step(self) -> None:
        """Inside a trace, before the optimizer steps (see :attr:`fresh`)."""
        ctx = _step.active_context()
        if ctx is None:
            return
        self.ensure_current()
        early = self._early_in(ctx) if self.fresh else {}
        self.fresh = set()
        self._stepped = weakref.ref(ctx)
        if early:
            raise traced.Retrace(functools.partial(self._roll_back, dict(early)),
                                "a torch scheduler stepped before its optimizer")

    def before_scheduler_step(self, scheduler: Any) -> None:
        """Inside a trace, before a converted scheduler steps."""
        ctx = _step.active_context()
        if ctx is None:
            return
        self.ensure_current()
        stepped = self._stepped is not None and self._stepped() is ctx
        if scheduler in self.fresh and not stepped:
            early = self._early_in(ctx)
            early[scheduler] = early.get(scheduler, 0) + 1

    def _early_in(self, ctx: Any) -> dict:
        if self._trace is None or self._trace() is not ctx:
            self._trace, self._early = weakref.ref(ctx), {}
        return self._early

    @staticmethod
    def _roll_back(early: dict) -> None:
        """Undoes the steps that schedulers took in the abandoned trace, before their
        optimizer stepped and was converted (torch ran them then)."""
        for scheduler, count in early.items():
            cerebrax = vars(scheduler)["_cerebrax"].cerebrax
            cerebrax.set_last_epoch(int(cerebrax.last_epoch) - count)

    def closed_form_scheduler(self) -> Any:
        """The converted scheduler that computes the learning rate, or None."""
        return next((s for s in self.schedulers
                     if vars(s)["_cerebrax"].kind == "converted"), None)


# ---- the optimizer facade ------------------------------------------------------------------
def _conversion(optimizer: Any) -> Conversion:
    return vars(optimizer)["_cerebrax"]


class TorchParamGroup(MutableMapping):
    """A param group of a converted torch optimizer: ``"params"`` are the torch
    parameters, the hyperparameters those of the converted optimizer's group (state:
    a new learning rate never recompiles), and the keys cerebrax does not use (a
    scheduler's ``initial_lr``, ``foreach``, a user's own) are kept as torch keeps them."""

    def __init__(self, conversion: Conversion, index: int):
        self._conversion = conversion
        self._index = index

    def _group(self) -> Any:
        return self._conversion.optimizer.param_groups[self._index]

    def _extras(self) -> dict:
        return self._conversion.extras[self._index]

    def __getitem__(self, key: str) -> Any:
        if key == "params":
            return self._conversion.params[self._index]
        group = self._group()
        return group[key] if key in set(group) else self._extras()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "params":
            raise StateError("The params of a param group are fixed once a traced step "
                             "converted its torch optimizer.")
        _check_write(self._conversion, self._index, key)
        group = self._group()
        if key in set(group):
            group[key] = _hyperparameter(value)
        else:
            self._extras()[key] = value

    def __delitem__(self, key: str) -> None:
        if key not in self._extras():
            raise StateError(f"{key!r} cannot be removed from a param group of a converted "
                             "torch optimizer.")
        del self._extras()[key]

    def __iter__(self) -> Iterator[str]:
        yield "params"
        keys = self._conversion.keys[self._index]  # torch's keys, in torch's order
        yield from keys
        yield from (k for k in self._extras() if k not in keys)

    def __len__(self) -> int:
        return len(list(iter(self)))

    def __repr__(self) -> str:
        return repr(dict(self))


def _hyperparameter(value: Any) -> Any:
    """A value written to a group as cerebrax takes it: a torch tensor of the step as
    its JAX value, another torch tensor as its Python number."""
    if not is_torch_tensor(value):
        return value
    converted = as_jax(value)
    return value.item() if converted is value else converted


def _check_write(conversion: Conversion, index: int, key: str) -> None:
    """Refuses a write to a converted optimizer's param group where it would train
    differently from torch: by a torch scheduler that was not converted with the
    optimizer, or of the learning rate that a converted scheduler computes."""
    scheduler = _writing_scheduler()
    other = conversion.closed_form_scheduler()
    if scheduler is not None and "_cerebrax" not in vars(scheduler):
        name = type(scheduler).__name__
        if _step.active_context() is not None:
            raise ConfigError(MSG_LATE_SCHEDULER.format(name=name))
        if other is not None:
            raise ConfigError(MSG_SECOND_SCHEDULER.format(name=name,
                                                          other=type(other).__name__))
    if key == "lr" and other is not None:
        raise ConfigError(MSG_LR_WRITE.format(index=index, other=type(other).__name__))


def _writing_scheduler() -> Any:
    """The torch scheduler among the callers of a param group's ``__setitem__``, if any."""
    from torch.optim.lr_scheduler import LRScheduler as TorchScheduler

    frame = sys._getframe(3)
    for _ in range(_WRITER_FRAMES):
        if frame is None:
            return None
        caller = frame.f_locals.get("self")
        if isinstance(caller, TorchScheduler):
            return caller
        frame = frame.f_back
    return None


class _OptimizerFacade:
    """Mixed into a converted torch optimizer's class: torch's API over the converted
    cerebrax optimizer (see the module docstring)."""

    @property
    def param_groups(self) -> list[TorchParamGroup]:
        """The param groups, torch's keys over the converted optimizer's values."""
        return _conversion(self).groups

    @property
    def state(self) -> Mapping:
        """Each torch parameter's state (torch tensors), read from the converted state;
        a snapshot, read-only (outside a traced step only)."""
        if _step.active_context() is not None:
            raise StateError("optimizer.state of a converted torch optimizer is read "
                             "outside the traced step (it holds the values of the last step).")
        params = [p for group in _conversion(self).params for p in group]
        saved = self.state_dict()["state"]
        return _StateSnapshot({params[i]: entry for i, entry in saved.items()})

    def step(self, closure: Any = None) -> Any:
        """The converted optimizer's step (inside a traced step, after backward)."""
        conversion = _conversion(self)
        conversion.before_optimizer_step()
        vars(self)["_opt_called"] = True  # what torch's schedulers check
        return conversion.optimizer.step(closure)

    step._wrapped_by_lr_sched = True  # torch's schedulers leave this step as it is

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The converted optimizer's ``zero_grad``."""
        conversion = _conversion(self)
        if _step.active_context() is not None:
            conversion.ensure_current()
        conversion.optimizer.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The converted state in torch's layout, with torch tensors."""
        import torch

        conversion = _conversion(self)
        saved = conversion.optimizer.state_dict()
        state = {i: {k: torch.as_tensor(np.array(v)) for k, v in entry.items()}
                 for i, entry in saved["state"].items()}
        groups = [_torch_group(saved_group, proxy)
                  for saved_group, proxy in zip(saved["param_groups"], conversion.groups)]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Loads a state dict of torch's layout (torch's own, or this one's) into the
        converted optimizer; keys cerebrax does not use are kept with the groups."""
        conversion = _conversion(self)
        conversion.optimizer.load_state_dict(state_dict)
        for extras, own, saved in zip(conversion.extras, conversion._own_keys(),
                                      state_dict["param_groups"]):
            extras.update({k: v for k, v in saved.items() if k != "params" and k not in own})

    def add_param_group(self, param_group: dict) -> None:
        """Refused: the param groups are fixed once a traced step converted the optimizer."""
        raise StateError(
            "add_param_group() on a torch optimizer that a traced step converted: the param "
            "groups are part of the compiled step. Add every group before the first call.")


def _torch_group(saved: dict, proxy: TorchParamGroup) -> dict:
    """A param group of a state dict with torch's keys: the converted optimizer's saved
    values (Python numbers), the other keys' values as torch keeps them."""
    out = {k: saved[k] if k in saved else proxy[k] for k in proxy if k != "params"}
    out["params"] = saved["params"]
    return out


class _StateSnapshot(Mapping):
    """``optimizer.state`` of a converted torch optimizer: read-only per-parameter dicts
    (a parameter without state reads as an empty one, as in torch)."""

    def __init__(self, entries: dict):
        self._entries = entries

    def __getitem__(self, param: Any) -> Mapping:
        return types.MappingProxyType(self._entries.get(param, {}))

    def __iter__(self) -> Iterator[Any]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


# ---- the scheduler facades -----------------------------------------------------------------
@dataclasses.dataclass
class _Link:
    """What a torch scheduler of a converted optimizer stands for."""

    conversion: Conversion
    plan: SchedulerPlan
    kind: str  # "converted", "refused" or "member"
    cerebrax: TorchScheduleLR | None
    owner: Any = None  # the converted composite a member belongs to


def _scheduler_link(scheduler: Any) -> _Link:
    return vars(scheduler)["_cerebrax"]


def _without_link(state_dict: dict) -> dict:
    state_dict.pop("_cerebrax", None)
    return state_dict


class _ConvertedScheduler:
    """Mixed into a converted torch scheduler's class: its counter and learning rates
    are the converted scheduler's (:class:`TorchScheduleLR`)."""

    @property
    def last_epoch(self) -> Any:
        """The step counter (an int outside a traced step, a traced array inside)."""
        value = _scheduler_link(self).cerebrax.last_epoch
        return value if _step.active_context() is not None else int(value)

    @last_epoch.setter
    def last_epoch(self, value: int) -> None:
        _scheduler_link(self).cerebrax.set_last_epoch(int(value))

    def step(self, epoch: Any = None) -> None:
        """Advances the converted counter one step (in the compiled step, or outside)."""
        if epoch is not None:
            raise ConfigError(
                f"{type(self).__name__}.step(epoch) is not supported once a traced step "
                "converted the scheduler: its learning rate is a closed form of the step "
                "counter; call step() once per step.")
        link = _scheduler_link(self)
        link.conversion.before_scheduler_step(self)
        link.cerebrax.step()

    def get_last_lr(self) -> list:
        """The learning rate of every param group, as the last step wrote it."""
        return link_rates(_scheduler_link(self))

    def get_lr(self) -> list:
        """The same as :meth:`get_last_lr` (the closed form computes nothing new)."""
        return self.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict, with the converted counter and learning rates."""
        self._sync_torch_fields()
        return _without_link(super().state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads torch's state dict; the converted counter moves to its step."""
        changed = sorted(k for k, v in state_dict.items()
                         if k not in _VOLATILE and k in vars(self) and vars(self)[k] != v)
        if changed:
            raise ConfigError(MSG_LOAD_OTHER_SETTINGS.format(name=type(self).__name__,
                                                             keys=", ".join(changed)))
        super().load_state_dict(state_dict)
        _scheduler_link(self).cerebrax.set_last_epoch(_raw_epoch(self))

    def _sync_torch_fields(self) -> None:
        epoch = self.last_epoch
        fields = vars(self)
        if "last_epoch" in fields:
            fields["_step_count"] = fields.get("_step_count", 1) + epoch - fields["last_epoch"]
            fields["last_epoch"] = epoch
        else:  # a ChainedScheduler: its members share the step
            for member in members(self):
                vars(member)["last_epoch"] = epoch
        fields["_last_lr"] = [float(v) for v in self.get_last_lr()]


def link_rates(link: _Link) -> list:
    """The learning rates a converted scheduler last wrote (floats outside a step)."""
    return list(link.cerebrax.get_last_lr())


def _raw_epoch(scheduler: Any) -> int:
    fields = vars(scheduler)
    if "last_epoch" in fields:
        return int(fields["last_epoch"])
    return _raw_epoch(members(scheduler, nested=False)[0])


class _MemberScheduler:
    """Mixed into a member of a converted SequentialLR or ChainedScheduler."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Refused: the converted composite owns the step counter."""
        owner = type(_scheduler_link(self).owner).__name__
        raise ConfigError(
            f"{type(self).__name__}.step() was called, but it is part of a {owner} that a "
            f"traced step converted; the {owner} owns the step counter. Call step() on the "
            f"{owner} only.")

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict (the member's own fields, as torch left them)."""
        return _without_link(super().state_dict())


class _RefusedScheduler:
    """Mixed into a scheduler of a converted optimizer that has no closed form: it
    refuses to step inside a traced step and steps as torch does outside one."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        """torch's step, outside a traced step only."""
        if _step.active_context() is not None:
            raise refusal(type(self).__name__, _scheduler_link(self).plan.reason)
        return super().step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict."""
        return _without_link(super().state_dict())


_SCHEDULER_FACADES = {"converted": _ConvertedScheduler, "refused": _RefusedScheduler,
                      "member": _MemberScheduler}
