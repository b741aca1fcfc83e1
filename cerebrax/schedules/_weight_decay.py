"""Weight-decay schedulers: the learning-rate schedulers writing ``weight_decay``.

Each class is the learning-rate scheduler of the same shape with cstorch's weight-decay
argument names (``initial_val`` for ``initial_learning_rate``, ``end_val``, ``val``,
``vals``, ``base_val``, ``max_val``); the closed forms, the step counter, the
composites and ``param_group_tags`` are the learning-rate schedulers'. The optimizer
keeps ``weight_decay`` in its state, so the scheduled value is what the next update
uses, and changing it never recompiles. Available as
``cstorch.optim.weight_decay_scheduler``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ._base import LRScheduler, ParamGroupTags
from ._composite import ChainedScheduler, ScalePerParamLR, SequentialLR
from ._schedulers import (
    AnnealStrategy,
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    CosineDecayLR,
    CyclicLR,
    CyclicMode,
    CyclicScaleMode,
    ExponentialLR,
    InverseExponentialTimeDecayLR,
    InverseSquareRootDecayLR,
    LambdaLR,
    LinearLR,
    MultiplicativeLR,
    MultiStepLR,
    OneCycleLR,
    PiecewiseConstantLR,
    PolynomialLR,
    StepLR,
)

if TYPE_CHECKING:
    from ._base import ScheduledOptimizer

__all__ = [
    "ChainedWD", "ConstantWD", "CosineAnnealingWD", "CosineAnnealingWarmRestartsWD",
    "CosineDecayWD", "CyclicWD", "ExponentialWD", "InverseExponentialTimeDecayWD",
    "InverseSquareRootDecayWD", "LambdaWD", "LinearWD", "MultiStepWD", "MultiplicativeWD",
    "OneCycleWD", "PiecewiseConstantWD", "PolynomialWD", "ScalePerParamWD", "SequentialWD",
    "StepWD", "WeightDecayScheduler",
]


class WeightDecayScheduler(LRScheduler):
    """Base of the weight-decay schedulers: writes each param group's ``weight_decay``.

    A custom one implements ``_get_closed_form_lr`` (the weight decay at
    ``self.last_epoch``), as an ``LRScheduler`` does. :meth:`get_last_value` reads the
    values written.
    """

    param_group_key = "weight_decay"
    _last_value_key = "_last_value"


class ConstantWD(WeightDecayScheduler, ConstantLR):
    """A constant weight decay ``val``."""

    def __init__(self, optimizer: ScheduledOptimizer, val: float, total_iters: int | None = None,
                 param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, val, total_iters, param_group_tags=param_group_tags)


class PolynomialWD(WeightDecayScheduler, PolynomialLR):
    """``end_val + (initial_val - end_val) * (1 - t / T) ** power`` for ``t < T``, then
    ``end_val`` (``T = total_iters``)."""

    def __init__(self, optimizer: ScheduledOptimizer,
                 initial_val: float, end_val: float, total_iters: int,
                 power: float = 1.0, cycle: bool = False,
                 param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, end_val, total_iters, power, cycle,
                         param_group_tags=param_group_tags)


class LinearWD(WeightDecayScheduler, LinearLR):
    """A linear ramp from ``initial_val`` to ``end_val`` in ``total_iters`` steps."""

    def __init__(self, optimizer: ScheduledOptimizer,
                 initial_val: float, end_val: float, total_iters: int,
                 cycle: bool = False, param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, end_val, total_iters, cycle,
                         param_group_tags=param_group_tags)


class ExponentialWD(WeightDecayScheduler, ExponentialLR):
    """``initial_val * decay_rate ** (t / total_iters)`` (floored with ``staircase``)."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_val: float, total_iters: int,
                 decay_rate: float, staircase: bool = False,
                 param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, total_iters, decay_rate, staircase,
                         param_group_tags=param_group_tags)


class InverseExponentialTimeDecayWD(WeightDecayScheduler, InverseExponentialTimeDecayLR):
    """``initial_val / (1 + decay_rate * t ** step_exponent / total_iters)``."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_val: float, step_exponent: int,
                 total_iters: int, decay_rate: float, staircase: bool = False,
                 param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, step_exponent, total_iters, decay_rate,
                         staircase, param_group_tags=param_group_tags)


class InverseSquareRootDecayWD(WeightDecayScheduler, InverseSquareRootDecayLR):
    """``initial_val * scale / sqrt(max(t, warmup_steps))``."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_val: float = 1.0, scale: float = 1.0,
                 warmup_steps: int = 1, param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, scale, warmup_steps,
                         param_group_tags=param_group_tags)


class CosineDecayWD(WeightDecayScheduler, CosineDecayLR):
    """``end_val + (initial_val - end_val) * (1 + cos(pi * min(t, T) / T)) / 2``."""

    def __init__(self, optimizer: ScheduledOptimizer,
                 initial_val: float, end_val: float, total_iters: int,
                 param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, end_val, total_iters,
                         param_group_tags=param_group_tags)


class SequentialWD(WeightDecayScheduler, SequentialLR):
    """Weight-decay schedulers one after the other (see ``SequentialLR``)."""

    def __init__(self, optimizer: ScheduledOptimizer, schedulers: list[WeightDecayScheduler],
                 milestones: Sequence[int], last_epoch: int = -1,
                 param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, schedulers, milestones, last_epoch,
                         param_group_tags=param_group_tags)


class PiecewiseConstantWD(WeightDecayScheduler, PiecewiseConstantLR):
    """``vals[k]`` where ``k`` is the number of milestones ``<= t``."""

    def __init__(self, optimizer: ScheduledOptimizer, vals: Sequence[float],
                 milestones: Sequence[int], param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, vals, milestones, param_group_tags=param_group_tags)


class MultiStepWD(WeightDecayScheduler, MultiStepLR):
    """``initial_val * gamma ** (number of milestones <= t)``."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_val: float, gamma: float,
                 milestones: Sequence[int], param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, gamma, milestones,
                         param_group_tags=param_group_tags)


class StepWD(WeightDecayScheduler, StepLR):
    """``initial_val * gamma ** floor(t / step_size)``."""

    def __init__(self, optimizer: ScheduledOptimizer,
                 initial_val: float, step_size: int, gamma: float,
                 param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, step_size, gamma,
                         param_group_tags=param_group_tags)


class CosineAnnealingWD(WeightDecayScheduler, CosineAnnealingLR):
    """``eta_min + (initial_val - eta_min) * (1 + cos(pi * t / T_max)) / 2``."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_val: float, T_max: int,  # noqa: N803
                 eta_min: float = 0.0, param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, T_max, eta_min,
                         param_group_tags=param_group_tags)


class LambdaWD(WeightDecayScheduler, LambdaLR):
    """``prod_i initial_val * lambda_i(t)`` over the lambdas of ``set_value_lambda``
    (``wd_lambda`` when given; see ``LambdaLR``)."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_val: float,
                 param_group_tags: ParamGroupTags = None, *,
                 wd_lambda: Callable | Sequence[Callable] | None = None):
        super().__init__(optimizer, initial_val, param_group_tags, lr_lambda=wd_lambda)


class CosineAnnealingWarmRestartsWD(WeightDecayScheduler, CosineAnnealingWarmRestarts):
    """SGDR restarts of the weight decay (see ``CosineAnnealingWarmRestarts``)."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_val: float, T_0: int,  # noqa: N803
                 T_mult: int = 1, eta_min: float = 0.0,  # noqa: N803
                 param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, T_0, T_mult, eta_min,
                         param_group_tags=param_group_tags)


class MultiplicativeWD(WeightDecayScheduler, MultiplicativeLR):
    """``initial_val * coefficient ** t``."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_val: float, coefficient: float,
                 param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, coefficient,
                         param_group_tags=param_group_tags)


class ChainedWD(WeightDecayScheduler, ChainedScheduler):
    """Multiplies weight-decay schedulers that share the step (see ``ChainedScheduler``):
    ``f_0(t) * prod_{i >= 1} f_i(t) / initial_val_i``."""

    def __init__(self, schedulers: list[WeightDecayScheduler],
                 param_group_tags: ParamGroupTags = None):
        super().__init__(schedulers, param_group_tags=param_group_tags)


class CyclicWD(WeightDecayScheduler, CyclicLR):
    """torch's ``CyclicLR`` policy between ``base_val`` and ``max_val``."""

    def __init__(self, optimizer: ScheduledOptimizer, base_val: float, max_val: float,
                 step_size_up: int = 2000, step_size_down: int | None = None,
                 mode: CyclicMode = "triangular", gamma: float = 1.0,
                 scale_mode: CyclicScaleMode = "cycle", param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, base_val, max_val, step_size_up, step_size_down, mode,
                         gamma, scale_mode, param_group_tags=param_group_tags)


class OneCycleWD(WeightDecayScheduler, OneCycleLR):
    """The 1cycle policy from ``initial_val`` up to ``max_val`` and down to
    ``initial_val / final_div_factor`` (see ``OneCycleLR``)."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_val: float, max_val: float,
                 total_steps: int = 1000, pct_start: float = 0.3,
                 final_div_factor: float = 1e4, three_phase: bool = False,
                 anneal_strategy: AnnealStrategy = "cos", param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_val, max_val, total_steps, pct_start,
                         final_div_factor, three_phase, anneal_strategy,
                         param_group_tags=param_group_tags)


class ScalePerParamWD(WeightDecayScheduler, ScalePerParamLR):
    """Scales a weight-decay scheduler's value per param group by the group's
    ``"adjust_learning_rate"``, else ``"adjust_val"``, else 1 (cstorch reads the same
    keys for both; see ``ScalePerParamLR``)."""

    def __init__(self, optimizer: ScheduledOptimizer, scheduler: WeightDecayScheduler,
                 param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, scheduler, param_group_tags=param_group_tags)
