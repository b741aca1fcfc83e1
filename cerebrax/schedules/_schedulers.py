"""The scheduler classes: thin wrappers that evaluate a closed form at ``last_epoch``.

Each class keeps cstorch's constructor arguments as attributes and builds its schedule
with the matching factory of :mod:`cerebrax.schedules`; none holds any math.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

import jax
from jax.typing import ArrayLike

from . import _cosine, _cyclic, _exponential, _polynomial, _step
from ._base import LRScheduler, ParamGroupTags, Schedule

if TYPE_CHECKING:
    from ._base import ScheduledOptimizer

__all__ = [
    "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CosineDecayLR",
    "CyclicLR", "ExponentialLR", "InverseExponentialTimeDecayLR", "InverseSquareRootDecayLR",
    "LambdaLR", "LinearLR", "MultiStepLR", "MultiplicativeLR", "OneCycleLR",
    "PiecewiseConstantLR", "PolynomialLR", "StepLR",
]

# The choices of CyclicLR's ``mode`` and ``scale_mode`` and OneCycleLR's ``anneal_strategy``.
CyclicMode = Literal["triangular", "triangular2", "exp_range"]
CyclicScaleMode = Literal["cycle", "iterations"]
AnnealStrategy = Literal["cos", "linear"]


class _ClosedFormScheduler(LRScheduler):
    _schedule: Schedule

    def _get_closed_form_lr(self) -> jax.Array:
        return self._schedule(self.last_epoch)

    def _lr_at(self, step: ArrayLike) -> jax.Array:
        return self._schedule(step)


class ConstantLR(_ClosedFormScheduler):
    """A constant learning rate: ``lr(t) = learning_rate``.

    ``total_iters`` only says how long the scheduler runs inside a ``SequentialLR``
    built by ``configure_lr_scheduler``.
    """

    def __init__(self, optimizer: ScheduledOptimizer,
                 learning_rate: float, total_iters: int | None = None,
                 param_group_tags: ParamGroupTags = None):
        self.learning_rate = learning_rate
        self._schedule = _polynomial.constant(learning_rate)
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _reference_lr(self) -> float | None:
        return self.learning_rate


class PolynomialLR(_ClosedFormScheduler):
    """``end + (init - end) * (1 - t / T) ** power`` for ``t < T``, then ``end``.

    torch's ``PolynomialLR(total_iters, power)`` is ``end_learning_rate=0`` with
    ``initial_learning_rate`` the optimizer's lr. ``cycle`` is accepted for cstorch
    compatibility and, as there, has no effect.
    """

    def __init__(self, optimizer: ScheduledOptimizer, initial_learning_rate: float,
                 end_learning_rate: float, total_iters: int, power: float = 1.0,
                 cycle: bool = False,
                 param_group_tags: ParamGroupTags = None):
        self.initial_learning_rate = initial_learning_rate
        self.end_learning_rate = end_learning_rate
        self.power = power
        self.cycle = cycle
        self._schedule = _polynomial.polynomial(
            initial_learning_rate, end_learning_rate, total_iters, power)
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)


class LinearLR(PolynomialLR):
    """A linear ramp from ``initial_learning_rate`` to ``end_learning_rate`` in
    ``total_iters`` steps, then constant (cstorch's LinearLR: absolute rates; torch's
    ``LinearLR(start_factor, end_factor)`` is ``lr * start_factor -> lr * end_factor``).

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.SGD(compiled.parameters(), lr=0.1)
      >>> scheduler = cstorch.optim.lr_scheduler.LinearLR(
      ...     optimizer, initial_learning_rate=0.1, end_learning_rate=0.0, total_iters=4)
      >>> lrs = []
      >>> for _ in range(6):
      ...     lrs.append(round(scheduler.get_last_lr()[0], 5))
      ...     scheduler.step()
      >>> lrs
      [0.1, 0.075, 0.05, 0.025, 0.0, 0.0]
    """

    def __init__(self, optimizer: ScheduledOptimizer, initial_learning_rate: float,
                 end_learning_rate: float, total_iters: int, cycle: bool = False,
                 param_group_tags: ParamGroupTags = None):
        super().__init__(optimizer, initial_learning_rate, end_learning_rate, total_iters,
                         power=1.0, cycle=cycle, param_group_tags=param_group_tags)


class ExponentialLR(_ClosedFormScheduler):
    """``init * decay_rate ** (t / total_iters)``; with ``staircase`` the exponent is
    ``floor(t / total_iters)``. torch's ``ExponentialLR(gamma)`` is ``total_iters=1``,
    ``decay_rate=gamma``; torch's ``StepLR(step_size, gamma)`` is
    ``total_iters=step_size, staircase=True``.
    """

    def __init__(self, optimizer: ScheduledOptimizer,
                 initial_learning_rate: float, total_iters: int,
                 decay_rate: float, staircase: bool = False,
                 param_group_tags: ParamGroupTags = None):
        self.initial_learning_rate = initial_learning_rate
        self.decay_rate = decay_rate
        self.staircase = staircase
        self._schedule = _exponential.exponential(
            initial_learning_rate, total_iters, decay_rate, staircase)
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)


class InverseExponentialTimeDecayLR(_ClosedFormScheduler):
    """``init / (1 + decay_rate * t ** step_exponent / total_iters)``, the quotient
    floored with ``staircase`` (Keras' ``InverseTimeDecay`` with a step exponent)."""

    def __init__(self, optimizer: ScheduledOptimizer,
                 initial_learning_rate: float, step_exponent: int,
                 total_iters: int, decay_rate: float, staircase: bool = False,
                 param_group_tags: ParamGroupTags = None):
        self.initial_learning_rate = initial_learning_rate
        self.step_exponent = step_exponent
        self.decay_rate = decay_rate
        self.staircase = staircase
        self._schedule = _exponential.inverse_exponential_time_decay(
            initial_learning_rate, step_exponent, total_iters, decay_rate, staircase)
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)


class InverseSquareRootDecayLR(_ClosedFormScheduler):
    """``init * scale / sqrt(max(t, warmup_steps))``."""

    def __init__(self, optimizer: ScheduledOptimizer,
                 initial_learning_rate: float = 1.0, scale: float = 1.0,
                 warmup_steps: int = 1,
                 param_group_tags: ParamGroupTags = None):
        self.initial_learning_rate = initial_learning_rate
        self.scale = scale
        self.warmup_steps = warmup_steps
        self._schedule = _exponential.inverse_square_root_decay(
            initial_learning_rate, scale, warmup_steps)
        super().__init__(optimizer, param_group_tags=param_group_tags)


class CosineDecayLR(_ClosedFormScheduler):
    """``end + (init - end) * (1 + cos(pi * min(t, T) / T)) / 2`` (Keras' ``CosineDecay``)."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_learning_rate: float,
                 end_learning_rate: float, total_iters: int,
                 param_group_tags: ParamGroupTags = None):
        self.initial_learning_rate = initial_learning_rate
        self.end_learning_rate = end_learning_rate
        self._schedule = _cosine.cosine_decay(
            initial_learning_rate, end_learning_rate, total_iters)
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)


class CosineAnnealingLR(_ClosedFormScheduler):
    """``eta_min + (init - eta_min) * (1 + cos(pi * t / T_max)) / 2``, periodic past
    ``T_max`` like torch's ``CosineAnnealingLR`` (whose ``base_lr`` is ``init``)."""

    def __init__(self, optimizer: ScheduledOptimizer,
                 initial_learning_rate: float, T_max: int,  # noqa: N803
                 eta_min: float = 0.0,
                 param_group_tags: ParamGroupTags = None):
        self.initial_learning_rate = initial_learning_rate
        self.T_max = T_max
        self.eta_min = eta_min
        self._schedule = _cosine.cosine_annealing(initial_learning_rate, T_max, eta_min)
        super().__init__(optimizer, param_group_tags=param_group_tags)


class CosineAnnealingWarmRestarts(_ClosedFormScheduler):
    """SGDR restarts: cycle ``i`` lasts ``T_0 * T_mult ** i`` steps and anneals from
    ``init`` to ``eta_min`` by ``eta_min + (init - eta_min) (1 + cos(pi T_cur / T_i)) / 2``.

    This follows torch's ``CosineAnnealingWarmRestarts``: ``T_cur`` is the number of
    steps since the last restart (``t mod T_0`` when ``T_mult == 1``) and any integer
    ``T_mult >= 1`` works. cstorch accepts only ``T_mult == 1`` and computes
    ``T_cur = T_0 * (floor(t / T_0) - 1)`` from the second cycle on, which holds the
    rate constant within each later cycle instead of restarting the cosine; cerebrax
    does not reproduce that.
    """

    def __init__(self, optimizer: ScheduledOptimizer,
                 initial_learning_rate: float, T_0: int,  # noqa: N803
                 T_mult: int = 1, eta_min: float = 0.0,  # noqa: N803
                 param_group_tags: ParamGroupTags = None):
        self.initial_learning_rate = initial_learning_rate
        self.T_0 = T_0
        self.T_mult = T_mult
        self.eta_min = eta_min
        self._schedule = _cosine.cosine_annealing_warm_restarts(
            initial_learning_rate, T_0, T_mult, eta_min)
        super().__init__(optimizer, param_group_tags=param_group_tags)


class StepLR(_ClosedFormScheduler):
    """``init * gamma ** floor(t / step_size)`` (torch's ``StepLR``)."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_learning_rate: float, step_size: int,
                 gamma: float,
                 param_group_tags: ParamGroupTags = None):
        self.initial_learning_rate = initial_learning_rate
        self.step_size = step_size
        self.gamma = gamma
        self._schedule = _step.step_decay(initial_learning_rate, step_size, gamma)
        super().__init__(optimizer, param_group_tags=param_group_tags)


class MultiStepLR(_ClosedFormScheduler):
    """``init * gamma ** (number of milestones <= t)`` (torch's ``MultiStepLR``)."""

    def __init__(self, optimizer: ScheduledOptimizer, initial_learning_rate: float, gamma: float,
                 milestones: Sequence[int],
                 param_group_tags: ParamGroupTags = None):
        self.initial_learning_rate = initial_learning_rate
        self.gamma = gamma
        self.milestones = milestones
        self._schedule = _step.multi_step(initial_learning_rate, gamma, milestones)
        super().__init__(optimizer, param_group_tags=param_group_tags)


class MultiplicativeLR(_ClosedFormScheduler):
    """``init * coefficient ** t`` (torch's ``MultiplicativeLR`` with a constant factor)."""

    def __init__(self, optimizer: ScheduledOptimizer,
                 initial_learning_rate: float, coefficient: float,
                 param_group_tags: ParamGroupTags = None):
        self.initial_learning_rate = initial_learning_rate
        self.coefficient = coefficient
        self._schedule = _step.multiplicative(initial_learning_rate, coefficient)
        super().__init__(optimizer, param_group_tags=param_group_tags)


class PiecewiseConstantLR(_ClosedFormScheduler):
    """``learning_rates[k]`` where ``k`` is the number of milestones ``<= t``.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.SGD(compiled.parameters(), lr=0.1)
      >>> scheduler = cstorch.optim.lr_scheduler.PiecewiseConstantLR(
      ...     optimizer, learning_rates=[0.1, 0.01, 0.001], milestones=[2, 4])
      >>> lrs = []
      >>> for _ in range(6):
      ...     lrs.append(round(scheduler.get_last_lr()[0], 5))
      ...     scheduler.step()
      >>> lrs
      [0.1, 0.1, 0.01, 0.01, 0.001, 0.001]
    """

    def __init__(self, optimizer: ScheduledOptimizer, learning_rates: Sequence[float],
                 milestones: Sequence[int],
                 param_group_tags: ParamGroupTags = None):
        self.learning_rates = learning_rates
        self.milestones = milestones
        self._schedule = _step.piecewise_constant(learning_rates, milestones)
        super().__init__(optimizer, param_group_tags=param_group_tags)

    def _reference_lr(self) -> float | None:
        return self.learning_rates[0]


class LambdaLR(_ClosedFormScheduler):
    """``prod_i initial_learning_rate * lambda_i(t)`` over the lambdas of
    :meth:`set_value_lambda`.

    With one ``lr_lambda`` this is torch's ``LambdaLR`` (``base_lr * lr_lambda(t)``).
    The lambda receives the int32 step and is traced, so it must use ``jnp`` ops
    (``jnp.minimum``, ``jnp.where``), not Python branches on the step. Without
    ``lr_lambda`` the rate is cstorch's placeholder ``init**2 * (t / 30) * 0.95**t``;
    cstorch expects subclasses to override :meth:`set_value_lambda`, which works here too.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.SGD(compiled.parameters(), lr=0.1)
      >>> scheduler = cstorch.optim.lr_scheduler.LambdaLR(
      ...     optimizer, 0.1, lr_lambda=lambda t: jnp.minimum(1.0, (t + 1) / 4))
      >>> lrs = []
      >>> for _ in range(6):
      ...     lrs.append(round(scheduler.get_last_lr()[0], 5))
      ...     scheduler.step()
      >>> lrs
      [0.025, 0.05, 0.075, 0.1, 0.1, 0.1]
    """

    def __init__(self, optimizer: ScheduledOptimizer, initial_learning_rate: float,
                 param_group_tags: ParamGroupTags = None, *,
                 lr_lambda: Callable | Sequence[Callable] | None = None):
        self.initial_learning_rate = initial_learning_rate
        self.lr_lambda = lr_lambda
        self._schedule = _step.lambda_schedule(
            initial_learning_rate, self.set_value_lambda())
        super().__init__(optimizer, param_group_tags=param_group_tags)

    def set_value_lambda(self) -> Callable | Sequence[Callable] | None:
        """The lambda(s) of the step; ``None`` selects cstorch's placeholders."""
        return self.lr_lambda


class CyclicLR(_ClosedFormScheduler):
    """torch's ``CyclicLR`` (modes ``"triangular"``, ``"triangular2"``, ``"exp_range"``):
    ``base_lr + (max_lr - base_lr) * rise(t) * scale``. Momentum is not cycled; the mode
    decides whether the scale follows the cycle or the step, as in cstorch."""

    def __init__(self, optimizer: ScheduledOptimizer, base_lr: float, max_lr: float,
                 step_size_up: int = 2000, step_size_down: int | None = None,
                 mode: CyclicMode = "triangular", gamma: float = 1.0,
                 scale_mode: CyclicScaleMode = "cycle",
                 param_group_tags: ParamGroupTags = None):
        self.base_lr = base_lr
        self.max_lr = max_lr
        self.step_size_up = step_size_up
        self.step_size_down = step_size_up if step_size_down is None else step_size_down
        self.mode = mode
        self.gamma = gamma
        self.scale_mode = scale_mode
        self._schedule = _cyclic.cyclic(
            base_lr, max_lr, step_size_up, step_size_down, mode, gamma, scale_mode)
        super().__init__(optimizer, param_group_tags=param_group_tags)

    def _reference_lr(self) -> float | None:
        return self.base_lr


class OneCycleLR(_ClosedFormScheduler):
    """The 1cycle policy of torch's ``OneCycleLR`` with
    ``initial_learning_rate = max_lr / div_factor`` and no momentum cycling.

    See :func:`cerebrax.schedules.one_cycle` for the phases. ``total_iters`` is
    ``total_steps``.
    """

    def __init__(self, optimizer: ScheduledOptimizer, initial_learning_rate: float, max_lr: float,
                 total_steps: int = 1000, pct_start: float = 0.3,
                 final_div_factor: float = 1e4, three_phase: bool = False,
                 anneal_strategy: AnnealStrategy = "cos",
                 param_group_tags: ParamGroupTags = None):
        self.initial_learning_rate = initial_learning_rate
        self.max_lr = max_lr
        self.total_steps = total_steps
        self.pct_start = pct_start
        self.final_div_factor = final_div_factor
        self.three_phase = three_phase
        self.anneal_strategy = anneal_strategy
        self._schedule = _cyclic.one_cycle(
            initial_learning_rate, max_lr, total_steps, pct_start, final_div_factor,
            three_phase, anneal_strategy)
        super().__init__(optimizer, total_iters=total_steps, param_group_tags=param_group_tags)
