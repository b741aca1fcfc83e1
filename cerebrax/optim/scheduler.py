"""``cstorch.optim.scheduler``: the scheduler base classes of cstorch 2.x.

``Scheduler`` is the base of every schedule of an optimizer's hyperparameters (learning
rate, weight decay), and ``SequentialScheduler``, ``PiecewiseConstantScheduler`` and
``ChainedScheduler`` combine schedules; in cerebrax they are the learning-rate ones of
:mod:`cerebrax.optim.lr_scheduler` (a closed-form function of the global step each).
"""

from .lr_scheduler import ChainedScheduler as ChainedScheduler
from .lr_scheduler import LRScheduler as Scheduler
from .lr_scheduler import PiecewiseConstantLR as PiecewiseConstantScheduler
from .lr_scheduler import SequentialLR as SequentialScheduler

__all__ = ["ChainedScheduler", "PiecewiseConstantScheduler", "Scheduler",
           "SequentialScheduler"]
