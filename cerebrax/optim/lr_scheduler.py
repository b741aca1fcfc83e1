"""``cstorch.optim.lr_scheduler``: the scheduler classes of :mod:`cerebrax.schedules`."""

from ..schedules import ConstantLR as ConstantLR
from ..schedules import CosineDecayLR as CosineDecayLR
from ..schedules import LinearLR as LinearLR
from ..schedules import LRScheduler as LRScheduler
from ..schedules import PolynomialLR as PolynomialLR
