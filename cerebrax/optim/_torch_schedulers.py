"""torch.optim.lr_scheduler schedulers as closed forms of the step counter.

In a compiled step the learning rate is a tensor computed from an int32 step counter
held in state (:mod:`cerebrax.schedules`); a torch scheduler's Python counter would
advance once, when the step is traced. When a traced step converts a torch optimizer
(:mod:`._torch_in_step`), each torch scheduler bound to it gets a plan here:

- :func:`closed_form` maps the scheduler to the :mod:`cerebrax.schedules` closed form
  with torch's formula, one per param group from the group's own ``base_lrs`` entry
  (StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR, ConstantLR,
  PolynomialLR, LambdaLR whose lambda traces on an int32 array,
  CosineAnnealingWarmRestarts, CyclicLR and OneCycleLR without momentum cycling, and
  SequentialLR and ChainedScheduler of those);
- :func:`plan` checks the mapping against torch itself: a copy of the scheduler, bound
  to a stand-in optimizer, steps :data:`CHECKED_STEPS` times from where the scheduler
  is, and every learning rate must equal the closed form's (float32: rel 1e-5). A
  scheduler that fails (ReduceLROnPlateau, which reads a metric; a class without a
  closed form; an untraceable lambda; a scheduler whose state left its closed form)
  gets a reason instead, and refuses to step inside a traced step
  (:data:`MSG_REFUSED`); between steps it runs as torch runs it.

:class:`TorchScheduleLR` is the cerebrax scheduler of a mapped plan.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import schedules
from ..errors import ConfigError
from ..schedules import LRScheduler, Schedule

if TYPE_CHECKING:
    from ._base import Optimizer as ScheduledOptimizer

__all__ = ["CHECKED_STEPS", "MSG_REFUSED", "SchedulerPlan", "TorchScheduleLR",
           "bound_schedulers", "closed_form", "epoch_of", "members", "plan", "refusal",
           "torch_field"]

CHECKED_STEPS = 64  # steps of torch's own scheduler each mapping is checked over

MSG_REFUSED = """\
torch.optim.lr_scheduler.{name}.step() was called inside a traced step. There the
learning rate is a closed form of the step counter (a torch scheduler's Python counter
would advance once, when the step is traced), and this scheduler cannot be written as
one: {reason}.
Fix: {fix}, or step it outside the traced step, between calls, where torch runs it as
it is:
    loss = training_step(inputs, targets)
    scheduler.step({args})"""

_FIXES = {
    "ReduceLROnPlateau": "pass it the value the step returns, outside the step",
    "LambdaLR": "write the lambda with jnp operations on the step (jnp.minimum, "
                "jnp.where), or use cstorch.optim.lr_scheduler.LambdaLR",
    "MultiplicativeLR": "use cstorch.optim.lr_scheduler.MultiplicativeLR (a constant "
                        "factor per step)",
    "CyclicLR": "pass cycle_momentum=False, or use cstorch.optim.lr_scheduler.CyclicLR",
    "OneCycleLR": "pass cycle_momentum=False, or use cstorch.optim.lr_scheduler.OneCycleLR",
}
_DEFAULT_FIX = ("use one of torch's schedulers that cerebrax maps (StepLR, MultiStepLR, "
                "ExponentialLR, CosineAnnealingLR, LinearLR, ConstantLR, PolynomialLR, "
                "LambdaLR, CosineAnnealingWarmRestarts, CyclicLR, OneCycleLR, SequentialLR, "
                "ChainedScheduler), or the cstorch scheduler of the same shape from "
                "cstorch.optim.lr_scheduler over a cstorch optimizer")


class Unmapped(Exception):
    """Why a torch scheduler has no closed form (becomes :attr:`SchedulerPlan.reason`)."""


def refusal(name: str, reason: str) -> ConfigError:
    """The error of a scheduler without a closed form stepped inside a traced step."""
    return ConfigError(MSG_REFUSED.format(
        name=name, reason=reason, fix=_FIXES.get(name, _DEFAULT_FIX),
        args="loss.item()" if name == "ReduceLROnPlateau" else ""))


# ---- closed forms --------------------------------------------------------------------------
def _base(s: Any, i: int) -> float:
    return float(s.base_lrs[i])


def _step(s: Any, i: int) -> Schedule:
    return schedules.step_decay(_base(s, i), s.step_size, s.gamma)


def _multi_step(s: Any, i: int) -> Schedule:
    return schedules.multi_step(_base(s, i), s.gamma, sorted(s.milestones.elements()))


def _exponential(s: Any, i: int) -> Schedule:
    return schedules.exponential(_base(s, i), 1, s.gamma)


def _cosine(s: Any, i: int) -> Schedule:
    return schedules.cosine_annealing(_base(s, i), s.T_max, s.eta_min)


def _linear(s: Any, i: int) -> Schedule:
    base = _base(s, i)
    return schedules.linear(base * s.start_factor, base * s.end_factor, s.total_iters)


def _constant(s: Any, i: int) -> Schedule:
    base = _base(s, i)
    return schedules.piecewise_constant([base * s.factor, base], [s.total_iters])


def _polynomial(s: Any, i: int) -> Schedule:
    return schedules.polynomial(_base(s, i), 0.0, s.total_iters, s.power)


def _lambda(s: Any, i: int) -> Schedule:
    return schedules.lambda_schedule(_base(s, i), s.lr_lambdas[i])


def _warm_restarts(s: Any, i: int) -> Schedule:
    return schedules.cosine_annealing_warm_restarts(_base(s, i), s.T_0, s.T_mult, s.eta_min)


def _no_momentum_cycle(s: Any) -> None:
    if s.cycle_momentum:
        raise Unmapped("it also cycles the momentum (cycle_momentum=True), which "
                       "cerebrax's closed form does not")


def _cyclic(s: Any, i: int) -> Schedule:
    _no_momentum_cycle(s)
    if torch_field(s, "_scale_fn_custom") is not None:
        raise Unmapped("it has a custom scale_fn")
    up = s.total_size * s.step_ratio
    if not float(up).is_integer() or not float(s.total_size).is_integer():
        raise Unmapped(f"its step sizes ({up}, {s.total_size - up}) are not whole steps")
    return schedules.cyclic(_base(s, i), float(s.max_lrs[i]), int(up),
                            int(s.total_size - up), s.mode, s.gamma, s.scale_mode)


def _one_cycle_pct(s: Any) -> float:
    """torch's ``pct_start``, from the first phase's end (``pct * total - 1``)."""
    end, total = torch_field(s, "_schedule_phases")[0]["end_step"], s.total_steps
    guess = (end + 1) / total
    for pct in (guess, math.nextafter(guess, 2.0), math.nextafter(guess, -1.0)):
        if float(pct * total) - 1 == end:
            return pct
    raise Unmapped(f"its first phase ends at step {end}, which no pct_start reproduces")


def _one_cycle(s: Any, i: int) -> Schedule:
    _no_momentum_cycle(s)
    group = s.optimizer.param_groups[i]
    init, peak, low = (float(group[k]) for k in ("initial_lr", "max_lr", "min_lr"))
    three_phase = len(torch_field(s, "_schedule_phases")) == 3
    return schedules.one_cycle(init, peak, s.total_steps, _one_cycle_pct(s), init / low,
                               three_phase, torch_field(s, "_anneal_func_type"))


def _sequential(s: Any, i: int) -> Schedule:
    forms = [closed_form(m, i) for m in torch_field(s, "_schedulers")]
    return schedules.sequential(forms, torch_field(s, "_milestones"))


def _chained(s: Any, i: int) -> Schedule:
    parts = torch_field(s, "_schedulers")
    return schedules.chained([closed_form(m, i) for m in parts],
                             initial_learning_rates=[_base(m, i) for m in parts[1:]])


@functools.cache
def _builders() -> dict[type, Callable[[Any, int], Schedule]]:
    from torch.optim import lr_scheduler as torch_schedulers

    return {getattr(torch_schedulers, name): builder for name, builder in [
        ("StepLR", _step), ("MultiStepLR", _multi_step), ("ExponentialLR", _exponential),
        ("CosineAnnealingLR", _cosine), ("LinearLR", _linear), ("ConstantLR", _constant),
        ("PolynomialLR", _polynomial), ("LambdaLR", _lambda),
        ("CosineAnnealingWarmRestarts", _warm_restarts), ("CyclicLR", _cyclic),
        ("OneCycleLR", _one_cycle), ("SequentialLR", _sequential),
        ("ChainedScheduler", _chained)]}


def closed_form(scheduler: Any, group: int) -> Schedule:
    """The closed form of torch ``scheduler``'s learning rate for param group ``group``,
    as a function of its ``last_epoch``; raises :class:`Unmapped` where there is none."""
    builder = _builders().get(type(scheduler))
    if builder is None:
        name = type(scheduler).__name__
        if name == "ReduceLROnPlateau":
            raise Unmapped("it decides from the value of a metric, which a traced step "
                           "does not have until the step has run")
        raise Unmapped(f"cerebrax has no closed form for {type(scheduler).__qualname__}")
    try:
        return builder(scheduler, group)
    except (ConfigError, AttributeError, TypeError, ValueError, ZeroDivisionError) as e:
        raise Unmapped(f"{type(e).__name__}: {e}") from None


def epoch_of(scheduler: Any) -> int:
    """The step a torch scheduler is at (a ChainedScheduler's: its members')."""
    if hasattr(scheduler, "last_epoch"):
        return int(scheduler.last_epoch)
    epochs = {epoch_of(m) for m in torch_field(scheduler, "_schedulers")}
    if len(epochs) != 1:
        raise Unmapped(f"its schedulers are at different steps {sorted(epochs)}")
    return epochs.pop()


# ---- finding and checking ------------------------------------------------------------------
def bound_schedulers(optimizer: Any) -> list[Any]:
    """Every live torch scheduler whose ``optimizer`` is ``optimizer``.

    Found through the garbage collector's referrers of the optimizer: a scheduler holds
    its optimizer in its attributes (directly, or through its ``__dict__`` once that
    exists as a dict of its own). Done once per conversion.
    """
    from torch.optim.lr_scheduler import LRScheduler as TorchScheduler

    found: dict[int, Any] = {}
    for referrer in gc.get_referrers(optimizer):
        candidates = [referrer]
        if isinstance(referrer, dict) and referrer.get("optimizer") is optimizer:
            candidates = gc.get_referrers(referrer)
        for obj in candidates:
            if isinstance(obj, TorchScheduler) and vars(obj).get("optimizer") is optimizer:
                found[id(obj)] = obj
    return list(found.values())


def torch_field(scheduler: Any, name: str) -> Any:
    """A field torch keeps private in a scheduler (``_schedulers``, ``_milestones``,
    ``_schedule_phases``, ... of torch 2.x), read from the instance's own attributes."""
    return vars(scheduler)[name]


def members(scheduler: Any, nested: bool = True) -> list[Any]:
    """The schedulers a torch SequentialLR or ChainedScheduler is made of, nested ones
    included unless ``nested`` is False (none for other schedulers)."""
    out = []
    for member in vars(scheduler).get("_schedulers", ()):
        out += [member, *(members(member) if nested else ())]
    return out


@dataclasses.dataclass
class SchedulerPlan:
    """What a torch scheduler becomes: ``schedules`` (one closed form per param group)
    starting at step ``last_epoch``, or None with the ``reason`` there are none."""

    scheduler: Any
    schedules: list[Schedule] | None
    last_epoch: int
    reason: str | None = None


def plan(scheduler: Any) -> SchedulerPlan:
    """The plan of a torch scheduler bound to a torch optimizer (not yet converted)."""
    try:
        epoch = epoch_of(scheduler)
        groups = len(scheduler.optimizer.param_groups)
        forms = [closed_form(scheduler, i) for i in range(groups)]
        _check(scheduler, forms, epoch)
    except Unmapped as e:
        return SchedulerPlan(scheduler, None, -1, str(e))
    return SchedulerPlan(scheduler, forms, epoch)


def _check(scheduler: Any, forms: list[Schedule], epoch: int) -> None:
    """Raises :class:`Unmapped` unless ``forms`` give torch's learning rates."""
    want = _torch_rates(scheduler, CHECKED_STEPS)
    got = _closed_form_rates(forms, np.arange(epoch, epoch + len(want), dtype=np.int32))
    scale = max(float(np.max(np.abs(want))), 1e-30)
    bad = np.abs(got - want) > 1e-5 * np.abs(want) + 1e-6 * scale
    if bad.any():
        k, g = np.argwhere(bad)[0]
        raise Unmapped(f"at step {epoch + k} torch gives param group {g} the rate "
                       f"{want[k, g]!r} and the closed form {float(got[k, g])!r}")


def _closed_form_rates(forms: list[Schedule], steps: np.ndarray) -> np.ndarray:
    """The closed forms' rates at ``steps`` (rows) for every param group (columns)."""
    def rates(t: jax.Array) -> jax.Array:
        return jnp.stack([jnp.asarray(f(t), jnp.float32) for f in forms])

    try:
        # Host sync point: the closed forms over the checked steps, once per conversion.
        return np.asarray(jax.jit(jax.vmap(rates))(steps))
    except Exception as e:  # noqa: BLE001 - a user's lambda may fail in any way
        first = (str(e).strip().splitlines() or [""])[0]
        raise Unmapped("its closed form cannot be evaluated on an int32 step "
                       f"({type(e).__name__}: {first})") from None


def _torch_rates(scheduler: Any, steps: int) -> np.ndarray:
    """The rates of every param group now and after each of up to ``steps`` steps of a
    copy of ``scheduler`` (bound to a stand-in optimizer); fewer where torch stops."""
    stand_in = _stand_in(scheduler.optimizer)
    twin = _twin(scheduler, stand_in)
    rates = [[float(g["lr"]) for g in stand_in.param_groups]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            try:
                twin.step()
            except Exception:  # noqa: BLE001 - OneCycleLR past total_steps, a user's lambda
                break
            rates.append([float(g["lr"]) for g in stand_in.param_groups])
    return np.asarray(rates, np.float64)


def _twin(scheduler: Any, optimizer: Any) -> Any:
    """A shallow copy of ``scheduler`` (and of its members) bound to ``optimizer``: a
    torch scheduler's step rebinds its attributes, never mutates them."""
    twin = copy.copy(scheduler)
    twin.optimizer = optimizer
    if "_schedulers" in vars(twin):
        vars(twin)["_schedulers"] = [_twin(m, optimizer) for m in members(scheduler, False)]
    return twin


def _stand_in(optimizer: Any) -> Any:
    """A torch optimizer with ``optimizer``'s param groups' values over one scalar each."""
    import torch

    groups = [{k: v for k, v in g.items() if k != "params"} | {"params": [torch.zeros(())]}
              for g in optimizer.param_groups]
    return _stand_in_class()(groups, {})


@functools.cache
def _stand_in_class() -> type:
    import torch

    class StandIn(torch.optim.Optimizer):
        """Holds param groups for a copied scheduler; it never steps."""

        def step(self, closure: Any = None) -> None:
            """Does nothing: only the scheduler's writes to the groups are read."""

    return StandIn


# ---- the cerebrax scheduler of a plan --------------------------------------------------------
class TorchScheduleLR(LRScheduler):
    """A converted torch scheduler: each param group's learning rate is its own closed
    form of the step counter (torch schedules every group from its own base lr).

    Args:
      optimizer: the cerebrax optimizer the torch optimizer was converted to.
      forms: one closed form per param group (:func:`closed_form`).
      last_epoch: the step the torch scheduler is at; the groups get that step's rates.
    """

    def __init__(self, optimizer: ScheduledOptimizer, forms: list[Schedule],
                 last_epoch: int):
        self._forms = list(forms)
        self._on_host = jax.jit(self._rates)  # outside a step: one program for all groups
        super().__init__(optimizer, last_epoch=last_epoch - 1)  # its first step: last_epoch

    def _rates(self, step: Any) -> list[jax.Array]:
        return [jnp.asarray(f(step), jnp.float32) for f in self._forms]

    def _get_closed_form_lr(self) -> jax.Array:
        return self._rates(self.last_epoch)[0]

    def _write_lr(self) -> None:
        step = self.last_epoch
        rates = self._rates(step) if isinstance(step, jax.core.Tracer) else self._on_host(step)
        groups = self.optimizer.param_groups
        for i in self._groups:
            groups[i]["lr"] = rates[i]

    def set_last_epoch(self, epoch: int) -> None:
        """Moves the counter to ``epoch`` and writes that step's rates (outside a step)."""
        self._counter.value = np.int32(epoch)
        self._write_lr()
