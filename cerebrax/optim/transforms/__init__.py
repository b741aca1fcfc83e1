"""Pure optax factories for every cerebrax optimizer (torch.optim numerics).

A JAX user needs none of the stateful classes: ``cerebrax.optim.transforms.adamw(...)``
is an ``optax.GradientTransformation`` like any other.
"""

from ._adafactor import RelativeStepState as RelativeStepState
from ._adafactor import TorchAdafactorState as TorchAdafactorState
from ._adafactor import adafactor as adafactor
from ._adafactor import scale_by_relative_step as scale_by_relative_step
from ._adafactor import scale_by_torch_factored_rms as scale_by_torch_factored_rms
from ._adam import TorchAdamState as TorchAdamState
from ._adam import adamw as adamw
from ._adam import scale_by_torch_adam as scale_by_torch_adam
from ._adam_family import TorchAdamaxState as TorchAdamaxState
from ._adam_family import TorchNAdamState as TorchNAdamState
from ._adam_family import TorchRAdamState as TorchRAdamState
from ._adam_family import adam as adam
from ._adam_family import adamax as adamax
from ._adam_family import add_decoupled_weight_decay as add_decoupled_weight_decay
from ._adam_family import nadam as nadam
from ._adam_family import radam as radam
from ._adam_family import scale_by_torch_adamax as scale_by_torch_adamax
from ._adam_family import scale_by_torch_nadam as scale_by_torch_nadam
from ._adam_family import scale_by_torch_radam as scale_by_torch_radam
from ._adaptive import AdadeltaState as AdadeltaState
from ._adaptive import AdagradState as AdagradState
from ._adaptive import ASGDState as ASGDState
from ._adaptive import RMSpropState as RMSpropState
from ._adaptive import RpropState as RpropState
from ._adaptive import adadelta as adadelta
from ._adaptive import adagrad as adagrad
from ._adaptive import asgd as asgd
from ._adaptive import rmsprop as rmsprop
from ._adaptive import rprop as rprop
from ._adaptive import scale_by_torch_adadelta as scale_by_torch_adadelta
from ._adaptive import scale_by_torch_adagrad as scale_by_torch_adagrad
from ._adaptive import scale_by_torch_asgd as scale_by_torch_asgd
from ._adaptive import scale_by_torch_rmsprop as scale_by_torch_rmsprop
from ._adaptive import scale_by_torch_rprop as scale_by_torch_rprop
from ._lamb_lion import LambState as LambState
from ._lamb_lion import LionState as LionState
from ._lamb_lion import lamb as lamb
from ._lamb_lion import lion as lion
from ._lamb_lion import scale_by_clamped_trust_ratio as scale_by_clamped_trust_ratio
from ._lamb_lion import scale_by_lamb_moments as scale_by_lamb_moments
from ._lamb_lion import scale_by_lion_sign as scale_by_lion_sign
from ._sgd import MomentumState as MomentumState
from ._sgd import scale_by_torch_momentum as scale_by_torch_momentum
from ._sgd import sgd as sgd
