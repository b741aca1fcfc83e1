"""Optimizers: pure optax factories (``transforms``) and thin cstorch-style classes."""

from ..schedules import configure_lr_scheduler as configure_lr_scheduler
from . import _torch_in_step  # noqa: F401  (converts torch optimizers stepped in a traced step)
from . import lr_scheduler as lr_scheduler
from . import optimizer as optimizer
from . import scheduler as scheduler
from . import transforms as transforms
from . import weight_decay_scheduler as weight_decay_scheduler
from ._adadelta import Adadelta as Adadelta
from ._adafactor import Adafactor as Adafactor
from ._adagrad import Adagrad as Adagrad
from ._adam import Adam as Adam
from ._adamax import Adamax as Adamax
from ._adamw import AdamW as AdamW
from ._asgd import ASGD as ASGD
from ._base import Optimizer as Optimizer
from ._base import ParamGroup as ParamGroup
from ._clip import clip_grad_norm_ as clip_grad_norm_
from ._clip import clip_grad_value_ as clip_grad_value_
from ._configure import configure_optimizer as configure_optimizer
from ._from_torch import from_torch as from_torch
from ._lamb_lion import Lamb as Lamb
from ._lamb_lion import Lion as Lion
from ._muon import Muon as Muon
from ._nadam import NAdam as NAdam
from ._optax_optimizer import OptaxOptimizer as OptaxOptimizer
from ._radam import RAdam as RAdam
from ._rmsprop import RMSprop as RMSprop
from ._rprop import Rprop as Rprop
from ._sgd import SGD as SGD
