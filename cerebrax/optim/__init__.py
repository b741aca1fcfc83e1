"""Optimizers: pure optax factories (``transforms``) and cstorch-style classes declared over them."""

from ..schedules import configure_lr_scheduler as configure_lr_scheduler
from . import _torch_in_step  # noqa: F401  (converts torch optimizers stepped in a traced step)
from . import lr_scheduler as lr_scheduler
from . import optimizer as optimizer
from . import scheduler as scheduler
from . import transforms as transforms
from . import weight_decay_scheduler as weight_decay_scheduler
from ._adafactor import Adafactor as Adafactor
from ._base import Optimizer as Optimizer
from ._base import ParamGroup as ParamGroup
from ._clip import clip_grad_norm_ as clip_grad_norm_
from ._clip import clip_grad_value_ as clip_grad_value_
from ._configure import configure_optimizer as configure_optimizer
from ._from_torch import from_torch as from_torch
from ._optax_optimizer import OptaxOptimizer as OptaxOptimizer
from ._torch_optimizers import ASGD as ASGD
from ._torch_optimizers import SGD as SGD
from ._torch_optimizers import Adadelta as Adadelta
from ._torch_optimizers import Adagrad as Adagrad
from ._torch_optimizers import Adam as Adam
from ._torch_optimizers import AdamW as AdamW
from ._torch_optimizers import Adamax as Adamax
from ._torch_optimizers import Lamb as Lamb
from ._torch_optimizers import Lion as Lion
from ._torch_optimizers import Muon as Muon
from ._torch_optimizers import NAdam as NAdam
from ._torch_optimizers import RAdam as RAdam
from ._torch_optimizers import RMSprop as RMSprop
from ._torch_optimizers import Rprop as Rprop
