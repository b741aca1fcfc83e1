"""The scheduler classes: thin wrappers that evaluate a closed form at ``last_epoch``."""

from __future__ import annotations

from typing import Any

import jax

from . import _closed_form
from ._base import LRScheduler

__all__ = ["ConstantLR", "CosineDecayLR", "LinearLR", "PolynomialLR"]


class _ClosedFormScheduler(LRScheduler):
    _schedule: _closed_form.Schedule

    def _get_closed_form_lr(self) -> jax.Array:
        return self._schedule(self.last_epoch)


class ConstantLR(_ClosedFormScheduler):
    """A constant learning rate: ``lr(t) = learning_rate``."""

    def __init__(self, optimizer: Any, learning_rate: float, total_iters: int | None = None):
        self.learning_rate = learning_rate
        self._schedule = _closed_form.constant(learning_rate)
        super().__init__(optimizer, total_iters=total_iters)


class PolynomialLR(_ClosedFormScheduler):
    """``end + (init - end) * (1 - t / T) ** power`` for ``t < T``, then ``end``.

    ``cycle`` is accepted for cstorch compatibility and, as there, has no effect.
    """

    def __init__(self, optimizer: Any, initial_learning_rate: float,
                 end_learning_rate: float, total_iters: int, power: float = 1.0,
                 cycle: bool = False):
        self.initial_learning_rate = initial_learning_rate
        self.end_learning_rate = end_learning_rate
        self.power = power
        self.cycle = cycle
        self._schedule = _closed_form.polynomial(
            initial_learning_rate, end_learning_rate, total_iters, power)
        super().__init__(optimizer, total_iters=total_iters)


class LinearLR(PolynomialLR):
    """A linear ramp from ``initial_learning_rate`` to ``end_learning_rate`` in
    ``total_iters`` steps, then constant (cstorch's LinearLR: absolute rates).

    Example:
      >>> scheduler = cstorch.optim.lr_scheduler.LinearLR(
      ...     optimizer, initial_learning_rate=0.1, end_learning_rate=0.0, total_iters=100)
    """

    def __init__(self, optimizer: Any, initial_learning_rate: float,
                 end_learning_rate: float, total_iters: int, cycle: bool = False):
        super().__init__(optimizer, initial_learning_rate, end_learning_rate, total_iters,
                         power=1.0, cycle=cycle)


class CosineDecayLR(_ClosedFormScheduler):
    """``end + (init - end) * (1 + cos(pi * min(t, T) / T)) / 2``."""

    def __init__(self, optimizer: Any, initial_learning_rate: float,
                 end_learning_rate: float, total_iters: int):
        self.initial_learning_rate = initial_learning_rate
        self.end_learning_rate = end_learning_rate
        self._schedule = _closed_form.cosine_decay(
            initial_learning_rate, end_learning_rate, total_iters)
        super().__init__(optimizer, total_iters=total_iters)
