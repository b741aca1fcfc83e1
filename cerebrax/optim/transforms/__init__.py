"""Pure optax factories for every cerebrax optimizer (torch.optim numerics).

A JAX user needs none of the stateful classes: ``cerebrax.optim.transforms.adamw(...)``
is an ``optax.GradientTransformation`` like any other.
"""

from ._adam import TorchAdamState as TorchAdamState
from ._adam import adamw as adamw
from ._adam import scale_by_torch_adam as scale_by_torch_adam
from ._sgd import MomentumState as MomentumState
from ._sgd import scale_by_torch_momentum as scale_by_torch_momentum
from ._sgd import sgd as sgd
