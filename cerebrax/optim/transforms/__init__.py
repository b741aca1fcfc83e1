"""Pure optax factories for every cerebrax optimizer (torch.optim numerics).

A JAX user needs none of the stateful classes: ``cerebrax.optim.transforms.adamw(...)``
is an ``optax.GradientTransformation`` like any other.

Example:
  The parameter after the first update of each factory (the gradient is the parameter,
  ``jnp.ones(2)``, where no other is given):

  >>> from cerebrax.optim import transforms as T
  >>> def first_step(tx, params=jnp.ones(2), grads=None):
  ...     params = {"w": params}
  ...     grads = params if grads is None else {"w": grads}
  ...     updates, _ = tx.update(grads, tx.init(params), params)
  ...     return optax.apply_updates(params, updates)["w"]
  >>> first_step(T.adadelta(1.0, eps=1e-2))
  Array([0.69848865, 0.69848865], dtype=float32)
  >>> first_step(T.adafactor(1e-2), params=jnp.ones(3))
  Array([0.99, 0.99, 0.99], dtype=float32)
  >>> first_step(T.adagrad(0.1))
  Array([0.9, 0.9], dtype=float32)
  >>> first_step(T.adam(1e-3))
  Array([0.999, 0.999], dtype=float32)
  >>> first_step(T.adamw(1e-3))
  Array([0.99899, 0.99899], dtype=float32)
  >>> first_step(T.adamax(2e-3))
  Array([0.998, 0.998], dtype=float32)
  >>> first_step(T.asgd(0.1))
  Array([0.89998996, 0.89998996], dtype=float32)
  >>> first_step(T.lamb(1e-2), params=jnp.full(4, 0.5), grads=jnp.ones(4))
  Array([0.495, 0.495, 0.495, 0.495], dtype=float32)
  >>> first_step(T.lion(0.1), grads=jnp.array([1.0, -2.0]))
  Array([0.9, 1.1], dtype=float32)
  >>> first_step(T.muon(0.02), params=jnp.eye(2)).round(4)
  Array([[0.9776, 0.    ],
         [0.    , 0.9776]], dtype=float32)
  >>> first_step(T.nadam(2e-3))
  Array([0.9978871, 0.9978871], dtype=float32)
  >>> first_step(T.radam(1e-3))
  Array([0.999, 0.999], dtype=float32)
  >>> first_step(T.rmsprop(0.01))
  Array([0.90000004, 0.90000004], dtype=float32)
  >>> first_step(T.rprop(0.1), grads=-jnp.ones(2))
  Array([1.1, 1.1], dtype=float32)
  >>> first_step(T.sgd(0.1, momentum=0.9))
  Array([0.9, 0.9], dtype=float32)
"""

from ._adadelta import AdadeltaState as AdadeltaState
from ._adadelta import adadelta as adadelta
from ._adadelta import scale_by_torch_adadelta as scale_by_torch_adadelta
from ._adafactor import RelativeStepState as RelativeStepState
from ._adafactor import TorchAdafactorState as TorchAdafactorState
from ._adafactor import adafactor as adafactor
from ._adafactor import scale_by_relative_step as scale_by_relative_step
from ._adafactor import scale_by_torch_factored_rms as scale_by_torch_factored_rms
from ._adagrad import AdagradState as AdagradState
from ._adagrad import adagrad as adagrad
from ._adagrad import scale_by_torch_adagrad as scale_by_torch_adagrad
from ._adam import TorchAdamState as TorchAdamState
from ._adam import adam as adam
from ._adam import adamw as adamw
from ._adam import add_decoupled_weight_decay as add_decoupled_weight_decay
from ._adam import scale_by_torch_adam as scale_by_torch_adam
from ._adamax import TorchAdamaxState as TorchAdamaxState
from ._adamax import adamax as adamax
from ._adamax import scale_by_torch_adamax as scale_by_torch_adamax
from ._asgd import ASGDState as ASGDState
from ._asgd import asgd as asgd
from ._asgd import scale_by_torch_asgd as scale_by_torch_asgd
from ._lamb_lion import LambState as LambState
from ._lamb_lion import LionState as LionState
from ._lamb_lion import lamb as lamb
from ._lamb_lion import lion as lion
from ._lamb_lion import scale_by_clamped_trust_ratio as scale_by_clamped_trust_ratio
from ._lamb_lion import scale_by_lamb_moments as scale_by_lamb_moments
from ._lamb_lion import scale_by_lion_sign as scale_by_lion_sign
from ._muon import MuonState as MuonState
from ._muon import muon as muon
from ._muon import scale_by_muon as scale_by_muon
from ._nadam import TorchNAdamState as TorchNAdamState
from ._nadam import nadam as nadam
from ._nadam import scale_by_torch_nadam as scale_by_torch_nadam
from ._radam import TorchRAdamState as TorchRAdamState
from ._radam import radam as radam
from ._radam import scale_by_torch_radam as scale_by_torch_radam
from ._rmsprop import RMSpropState as RMSpropState
from ._rmsprop import rmsprop as rmsprop
from ._rmsprop import scale_by_torch_rmsprop as scale_by_torch_rmsprop
from ._rprop import RpropState as RpropState
from ._rprop import rprop as rprop
from ._rprop import scale_by_torch_rprop as scale_by_torch_rprop
from ._sgd import MomentumState as MomentumState
from ._sgd import scale_by_torch_momentum as scale_by_torch_momentum
from ._sgd import sgd as sgd
