"""Optimizers: pure optax factories (``transforms``) and thin cstorch-style classes."""

from ..schedules import configure_lr_scheduler as configure_lr_scheduler
from . import lr_scheduler as lr_scheduler
from . import transforms as transforms
from ._adafactor import Adafactor as Adafactor
from ._adam_family import Adam as Adam
from ._adam_family import Adamax as Adamax
from ._adam_family import NAdam as NAdam
from ._adam_family import RAdam as RAdam
from ._adamw import AdamW as AdamW
from ._adaptive import ASGD as ASGD
from ._adaptive import Adadelta as Adadelta
from ._adaptive import Adagrad as Adagrad
from ._adaptive import RMSprop as RMSprop
from ._adaptive import Rprop as Rprop
from ._base import Optimizer as Optimizer
from ._base import ParamGroup as ParamGroup
from ._clip import clip_grad_norm_ as clip_grad_norm_
from ._clip import clip_grad_value_ as clip_grad_value_
from ._configure import configure_optimizer as configure_optimizer
from ._lamb_lion import Lamb as Lamb
from ._lamb_lion import Lion as Lion
from ._optax_optimizer import OptaxOptimizer as OptaxOptimizer
from ._sgd import SGD as SGD
