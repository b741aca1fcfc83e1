"""The torch.optim optimizers, and cstorch's Lamb, Lion and Muon, as declarations.

Each class is torch's (or cstorch's) signature with cstorch's defaults, torch's argument
checks, the optax factory of :mod:`cerebrax.optim.transforms` that holds the update math,
and the state layout that gives its ``state_dict()`` torch's per-parameter keys
(:mod:`._declared`, :mod:`._torch_layout`). ``foreach``, ``fused`` and ``capturable`` are
accepted and ignored (the whole step is one fused program); ``differentiable=True`` is
rejected. The Adam family keeps one step count per param group, written to every
parameter's entry.

Every optimizer is used the same way:

Example:
  >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
  >>> optimizer = cstorch.optim.Adam(compiled.parameters(), lr=1e-3)
  >>> @cstorch.trace
  ... def train_step(inputs, targets):
  ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
  ...     optimizer.zero_grad()
  ...     loss.backward()
  ...     optimizer.step()
  ...     return loss
  >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
  >>> sorted(optimizer.state_dict()["state"][0])  # torch.optim.Adam's state of the weight
  ['exp_avg', 'exp_avg_sq', 'step']
"""

from __future__ import annotations

from ._base import ParamsT
from ._declared import (EPS, LR, MOMENTUM, WEIGHT_DECAY, BuiltMomentum, TorchOptimizer,
                        at_least_zero, check, check_betas, declared)
from ._torch_layout import AdamLayout, AdaptiveLayout, MomentLayout, MomentumLayout
from .transforms import _adadelta, _adagrad, _adam, _adamax, _asgd, _lamb_lion, _muon
from .transforms import _nadam, _radam, _rmsprop, _rprop, _sgd

__all__ = ["ASGD", "SGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "Lamb", "Lion",
           "Muon", "NAdam", "RAdam", "RMSprop", "Rprop"]


# ---- the Adam family ------------------------------------------------------------------
class _AdamFamily(AdamLayout, TorchOptimizer):
    """What Adam, Adamax, NAdam and RAdam share: torch's checks of their arguments and
    ``betas`` kept as Python numbers (torch computes ``1 - beta`` in double precision)."""

    _static_hyperparameters = ("betas",)
    _checks = (LR, EPS, check_betas, WEIGHT_DECAY)


class Adam(_AdamFamily):
    """Adam with torch.optim.Adam's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.adam` for the update rule. The defaults are
    cstorch's: ``eps=1e-6`` (torch's is ``1e-8``). ``weight_decay`` is an L2 penalty on
    the gradient, or decoupled (AdamW) with ``decoupled_weight_decay=True``. The state
    dict holds ``step``, ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` with
    ``amsgrad``) per parameter, as torch's.
    """

    _state_type = _adam.TorchAdamState
    _factory = _adam.adam

    @declared
    def __init__(self, params: ParamsT, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None,
                 decoupled_weight_decay: bool = False): ...


class AdamW(Adam):
    """AdamW with torch.optim.AdamW's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.adamw` for the update rule: Adam's, with the
    parameters decayed by ``1 - lr * weight_decay`` instead of an L2 penalty on the
    gradient. The defaults are cstorch's: ``eps=1e-6``, ``weight_decay=0.0`` (torch's are
    ``1e-8`` and ``1e-2``). ``correct_bias`` is cstorch's switch for the bias correction.

    Example:
      >>> model = cstorch.compile(torch.nn.Linear(2, 1), "CPU")
      >>> cstorch.optim.AdamW(model.parameters(), lr=1e-3).defaults["weight_decay"]
      0.0
    """

    _factory = _adam.adamw

    @declared
    def __init__(self, params: ParamsT, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False,
                 correct_bias: bool = True, foreach: bool | None = None,
                 capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None): ...


class Adamax(_AdamFamily):
    """Adamax with torch.optim.Adamax's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.adamax` for the update rule. The defaults are
    cstorch's: ``lr=1e-3``, ``eps=1e-6`` (torch's are ``2e-3`` and ``1e-8``). The state
    dict holds ``step``, ``exp_avg`` and ``exp_inf`` per parameter.
    """

    _state_type = _adamax.TorchAdamaxState
    _factory = _adamax.adamax

    @declared
    def __init__(self, params: ParamsT, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False): ...


class NAdam(_AdamFamily):
    """NAdam with torch.optim.NAdam's signature and numerics.

    See :func:`cerebrax.optim.transforms.nadam` for the update rule. ``betas`` and
    ``momentum_decay`` are part of the compiled step. The state dict holds ``step``,
    ``mu_product``, ``exp_avg`` and ``exp_avg_sq`` per parameter; cerebrax keeps one
    step count and one ``mu_product`` per param group.
    """

    _static_hyperparameters = ("betas", "momentum_decay")
    _state_type = _nadam.TorchNAdamState
    _scalar_fields = ("mu_product",)
    _factory = _nadam.nadam
    _checks = (*_AdamFamily._checks, at_least_zero("momentum_decay"))

    @declared
    def __init__(self, params: ParamsT, lr: float = 2e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False): ...


class RAdam(_AdamFamily):
    """RAdam with torch.optim.RAdam's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.radam` for the update rule. The defaults are
    cstorch's: ``eps=1e-6`` (torch's is ``1e-8``). The state dict holds ``step``,
    ``exp_avg`` and ``exp_avg_sq`` per parameter.
    """

    _state_type = _radam.TorchRAdamState
    _factory = _radam.radam

    @declared
    def __init__(self, params: ParamsT, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False): ...


# ---- the adaptive ones ----------------------------------------------------------------
class Adadelta(AdaptiveLayout, TorchOptimizer):
    """Adadelta with torch.optim.Adadelta's signature and numerics.

    See :func:`cerebrax.optim.transforms.adadelta` for the update rule. The state dict
    holds ``step``, ``square_avg`` and ``acc_delta`` per parameter.
    """

    _static_hyperparameters = ("rho",)
    _state_type = _adadelta.AdadeltaState
    _factory = _adadelta.adadelta
    _checks = (LR, lambda o: check(0.0 <= o["rho"] <= 1.0, f"Invalid rho value: {o['rho']}"),
               EPS, WEIGHT_DECAY)

    @declared
    def __init__(self, params: ParamsT, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0, foreach: bool | None = None, *,
                 capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False): ...


class Adagrad(AdaptiveLayout, TorchOptimizer):
    """Adagrad with torch.optim.Adagrad's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.adagrad` for the update rule. The defaults are
    cstorch's: ``eps=1e-6`` (torch's is ``1e-10``). As in torch, every group's
    accumulator starts at the constructor's ``initial_accumulator_value`` and the state
    (``step`` and ``sum`` per parameter) exists before the first step.
    """

    _static_hyperparameters = ("initial_accumulator_value",)
    _state_type = _adagrad.AdagradState
    _state_before_first_step = True
    _factory = _adagrad.adagrad
    _checks = (LR, at_least_zero("lr_decay"), WEIGHT_DECAY,
               at_least_zero("initial_accumulator_value"), EPS)

    @declared
    def __init__(self, params: ParamsT, lr: float = 1e-2, lr_decay: float = 0,
                 weight_decay: float = 0, initial_accumulator_value: float = 0,
                 eps: float = 1e-6, foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: bool | None = None): ...

    def _fill(self, field: str) -> float:
        return float(self.defaults["initial_accumulator_value"])

    def _factory_arguments(self, group):
        initial = self.defaults["initial_accumulator_value"]
        return {**super()._factory_arguments(group), "initial_accumulator_value": initial}


class ASGD(AdaptiveLayout, TorchOptimizer):
    """Averaged SGD with torch.optim.ASGD's signature and numerics.

    See :func:`cerebrax.optim.transforms.asgd` for the update rule. The state dict holds
    ``step``, ``eta``, ``mu`` and the averaged parameters ``ax`` per parameter.
    """

    _static_hyperparameters = ("lambd", "alpha", "t0")
    _state_type = _asgd.ASGDState
    _scalar_fields = ("eta", "mu")
    _factory = _asgd.asgd
    _checks = (LR, WEIGHT_DECAY)

    @declared
    def __init__(self, params: ParamsT, lr: float = 1e-2, lambd: float = 1e-4,
                 alpha: float = 0.75, t0: float = 1e6, weight_decay: float = 0,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False): ...

    def _fill(self, field: str) -> float:
        return 1.0 if field == "mu" else 0.0


class RMSprop(AdaptiveLayout, BuiltMomentum):
    """RMSprop with torch.optim.RMSprop's signature and numerics.

    See :func:`cerebrax.optim.transforms.rmsprop` for the update rule. Whether a group
    keeps a momentum buffer is fixed by its momentum when the optimizer is built. The
    state dict holds ``step``, ``square_avg``, and ``momentum_buffer`` (with momentum)
    and ``grad_avg`` (centered) per parameter.
    """

    _static_hyperparameters = ("alpha",)
    _state_type = _rmsprop.RMSpropState
    _factory = _rmsprop.rmsprop
    _checks = (LR, EPS, MOMENTUM, WEIGHT_DECAY, at_least_zero("alpha"))

    @declared
    def __init__(self, params: ParamsT, lr: float = 1e-2, alpha: float = 0.99,
                 eps: float = 1e-8, weight_decay: float = 0, momentum: float = 0,
                 centered: bool = False, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False): ...

    @staticmethod
    def _has_buffer(momentum: float) -> bool:
        return momentum > 0.0


class Rprop(AdaptiveLayout, TorchOptimizer):
    """Rprop with torch.optim.Rprop's signature and numerics and cstorch's defaults.

    See :func:`cerebrax.optim.transforms.rprop` for the update rule; ``lr`` is only the
    initial step size, read at the first step. The defaults are cstorch's: ``lr=1e-3``
    (torch's is ``1e-2``). The state dict holds ``step``, ``prev`` and ``step_size`` per
    parameter.
    """

    _state_type = _rprop.RpropState
    _factory = _rprop.rprop
    _checks = (LR, lambda o: check(0.0 < o["etas"][0] < 1.0 < o["etas"][1],
                                   f"Invalid eta values: {o['etas'][0]}, {o['etas'][1]}"))

    @declared
    def __init__(self, params: ParamsT, lr: float = 1e-3,
                 etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50.0), *, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False): ...


# ---- momentum -------------------------------------------------------------------------
def _check_nesterov(options) -> None:
    check(not options["nesterov"] or (options["momentum"] > 0 and options["dampening"] == 0),
          "Nesterov momentum requires a momentum and zero dampening")


class SGD(MomentumLayout, BuiltMomentum):
    """Stochastic gradient descent with torch.optim.SGD's signature and numerics.

    See :func:`cerebrax.optim.transforms.sgd` for the update rule. As in cstorch, ``lr``
    has no default (torch's is ``1e-3``). The state dict holds ``momentum_buffer`` per
    parameter once a step with momentum has run.

    Example:
      >>> model = cstorch.compile(torch.nn.Linear(2, 1), "CPU")
      >>> cstorch.optim.SGD(model.parameters())  # no default learning rate
      Traceback (most recent call last):
      TypeError: missing a required argument: 'lr'
    """

    _static_hyperparameters = ("dampening",)
    _state_type = _sgd.MomentumState
    _factory = _sgd.sgd
    _checks = (LR, MOMENTUM, WEIGHT_DECAY, _check_nesterov)

    @declared
    def __init__(self, params: ParamsT, lr: float, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False,
                 fused: bool | None = None): ...


class Muon(MomentumLayout, TorchOptimizer):
    """Muon with cstorch's signature and defaults.

    See :func:`cerebrax.optim.transforms.muon` for the update rule: heavy-ball momentum
    with a Nesterov blend, orthogonalized by ``ns_steps`` quintic Newton-Schulz
    iterations and scaled by ``sqrt(max(1, rows / cols))``, with decoupled weight decay
    ``p * (1 - lr * weight_decay)``.

    Muon is meant for the hidden layers' weight matrices. Other parameters are
    accepted, so a cstorch configuration that hands every parameter to Muon runs:
    0-D and 1-D parameters (biases, norm gains) take the plain momentum step (the same
    momentum, Nesterov blend, ``lr`` and weight decay, without orthogonalization), and
    parameters with more than two dimensions are orthogonalized as
    ``(shape[0], prod(shape[1:]))``. To train those with AdamW instead, give them to a
    second optimizer.

    The state dict holds ``momentum_buffer`` per parameter, as ``torch.optim.Muon``'s.
    """

    _static_hyperparameters = ("ns_steps",)
    _state_type = _muon.MuonState
    _factory = _muon.muon
    _checks = (LR, WEIGHT_DECAY, MOMENTUM, lambda o: _muon.check_ns_steps(o["ns_steps"]))

    @declared
    def __init__(self, params: ParamsT, lr: float = 0.02, weight_decay: float = 0.01,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5): ...


# ---- cstorch's Lamb and Lion ----------------------------------------------------------
class Lamb(MomentLayout, TorchOptimizer):
    """Lamb with cstorch's signature and numerics.

    See :func:`cerebrax.optim.transforms.lamb` for the update rule: Adam moments
    without bias correction, ``weight_decay * p`` added to the Adam step, and a
    layer-wise trust ratio ``clip(||p||, 0, 10) / ||r||`` (1 when ``adam=True``).
    ``maximize`` negates the gradient. The state dict holds ``exp_avg`` and
    ``exp_avg_sq`` per parameter from the start.
    """

    _static_hyperparameters = ("betas",)
    _state_type = _lamb_lion.LambState
    _factory = _lamb_lion.lamb
    _checks = (LR, check_betas, WEIGHT_DECAY, EPS)

    @declared
    def __init__(self, params: ParamsT, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0, adam: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False): ...


class Lion(MomentLayout, TorchOptimizer):
    """Lion with cstorch's signature and numerics.

    See :func:`cerebrax.optim.transforms.lion` for the update rule: the sign of an
    interpolation of momentum and gradient, with decoupled weight decay
    ``p *= 1 - lr * weight_decay``. ``maximize`` negates the gradient. The state dict
    holds ``exp_avg`` per parameter from the start.
    """

    _static_hyperparameters = ("betas",)
    _state_type = _lamb_lion.LionState
    _factory = _lamb_lion.lion
    _checks = (LR, check_betas, WEIGHT_DECAY)

    @declared
    def __init__(self, params: ParamsT, lr: float = 1e-4,
                 betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0, *,
                 maximize: bool = False, foreach: bool | None = None,
                 differentiable: bool = False): ...
