"""Closed-form schedules, the ``LRScheduler`` classes and the weight-decay schedulers.

Every schedule is a pure function of the step (``cerebrax.schedules.cosine_decay(...)``)
and a cstorch-style class that evaluates it (re-exported as
``cerebrax.optim.lr_scheduler``); the same classes with cstorch's weight-decay argument
names write ``weight_decay`` (``cerebrax.optim.weight_decay_scheduler``).
"""

from ._base import LRScheduler as LRScheduler
from ._base import Schedule as Schedule
from ._composite import ChainedLR as ChainedLR
from ._composite import ChainedScheduler as ChainedScheduler
from ._composite import ScalePerParamLR as ScalePerParamLR
from ._composite import SequentialLR as SequentialLR
from ._composite import chained as chained
from ._composite import sequential as sequential
from ._configure import configure_lr_scheduler as configure_lr_scheduler
from ._cosine import cosine_annealing as cosine_annealing
from ._cosine import cosine_annealing_warm_restarts as cosine_annealing_warm_restarts
from ._cosine import cosine_decay as cosine_decay
from ._cyclic import cyclic as cyclic
from ._cyclic import one_cycle as one_cycle
from ._exponential import exponential as exponential
from ._exponential import inverse_exponential_time_decay as inverse_exponential_time_decay
from ._exponential import inverse_square_root_decay as inverse_square_root_decay
from ._polynomial import constant as constant
from ._polynomial import linear as linear
from ._polynomial import polynomial as polynomial
from ._schedulers import ConstantLR as ConstantLR
from ._schedulers import CosineAnnealingLR as CosineAnnealingLR
from ._schedulers import CosineAnnealingWarmRestarts as CosineAnnealingWarmRestarts
from ._schedulers import CosineDecayLR as CosineDecayLR
from ._schedulers import CyclicLR as CyclicLR
from ._schedulers import ExponentialLR as ExponentialLR
from ._schedulers import InverseExponentialTimeDecayLR as InverseExponentialTimeDecayLR
from ._schedulers import InverseSquareRootDecayLR as InverseSquareRootDecayLR
from ._schedulers import LambdaLR as LambdaLR
from ._schedulers import LinearLR as LinearLR
from ._schedulers import MultiplicativeLR as MultiplicativeLR
from ._schedulers import MultiStepLR as MultiStepLR
from ._schedulers import OneCycleLR as OneCycleLR
from ._schedulers import PiecewiseConstantLR as PiecewiseConstantLR
from ._schedulers import PolynomialLR as PolynomialLR
from ._schedulers import StepLR as StepLR
from ._step import lambda_schedule as lambda_schedule
from ._step import multi_step as multi_step
from ._step import multiplicative as multiplicative
from ._step import piecewise_constant as piecewise_constant
from ._step import step_decay as step_decay
from ._weight_decay import ChainedWD as ChainedWD
from ._weight_decay import ConstantWD as ConstantWD
from ._weight_decay import CosineAnnealingWD as CosineAnnealingWD
from ._weight_decay import CosineAnnealingWarmRestartsWD as CosineAnnealingWarmRestartsWD
from ._weight_decay import CosineDecayWD as CosineDecayWD
from ._weight_decay import CyclicWD as CyclicWD
from ._weight_decay import ExponentialWD as ExponentialWD
from ._weight_decay import InverseExponentialTimeDecayWD as InverseExponentialTimeDecayWD
from ._weight_decay import InverseSquareRootDecayWD as InverseSquareRootDecayWD
from ._weight_decay import LambdaWD as LambdaWD
from ._weight_decay import LinearWD as LinearWD
from ._weight_decay import MultiStepWD as MultiStepWD
from ._weight_decay import MultiplicativeWD as MultiplicativeWD
from ._weight_decay import OneCycleWD as OneCycleWD
from ._weight_decay import PiecewiseConstantWD as PiecewiseConstantWD
from ._weight_decay import PolynomialWD as PolynomialWD
from ._weight_decay import ScalePerParamWD as ScalePerParamWD
from ._weight_decay import SequentialWD as SequentialWD
from ._weight_decay import StepWD as StepWD
from ._weight_decay import WeightDecayScheduler as WeightDecayScheduler
