"""``cstorch.optim.weight_decay_scheduler``: the weight-decay schedulers of
:mod:`cerebrax.schedules`."""

from ..schedules import ChainedWD as ChainedWD
from ..schedules import ConstantWD as ConstantWD
from ..schedules import CosineAnnealingWarmRestartsWD as CosineAnnealingWarmRestartsWD
from ..schedules import CosineAnnealingWD as CosineAnnealingWD
from ..schedules import CosineDecayWD as CosineDecayWD
from ..schedules import CyclicWD as CyclicWD
from ..schedules import ExponentialWD as ExponentialWD
from ..schedules import InverseExponentialTimeDecayWD as InverseExponentialTimeDecayWD
from ..schedules import InverseSquareRootDecayWD as InverseSquareRootDecayWD
from ..schedules import LambdaWD as LambdaWD
from ..schedules import LinearWD as LinearWD
from ..schedules import MultiplicativeWD as MultiplicativeWD
from ..schedules import MultiStepWD as MultiStepWD
from ..schedules import OneCycleWD as OneCycleWD
from ..schedules import PiecewiseConstantWD as PiecewiseConstantWD
from ..schedules import PolynomialWD as PolynomialWD
from ..schedules import ScalePerParamWD as ScalePerParamWD
from ..schedules import SequentialWD as SequentialWD
from ..schedules import StepWD as StepWD
from ..schedules import WeightDecayScheduler as WeightDecayScheduler
